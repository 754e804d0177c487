"""The parameter server (Li et al. 2014): `server` owns key ranges and applies pushes (sync, async,
SSP with a staleness bound), `client` is a worker's push and pull by range."""
