"""Seeing a step: the traced steps of a run as Chrome trace-event files, merged across ranks.

Start with `write.write_traces` (what `ringzero train --trace DIR` calls): each rank's traced
steps (`train.tracing.Tracer.data`, plain data) become `DIR/ranks/rank<R>.json`
(`events.rank_events`, in the format torch.profiler's Kineto writes, a folder Holistic Trace
Analysis reads as it is) and `DIR/merged.json` (`merge`: every rank on one
clock, flows joining each collective's records). `validate` checks a trace against the rules
Perfetto and chrome://tracing read by; `analysis` reads a merged trace (or a run report) back into
what each step spent its time on and names the bottleneck (`ringzero analyze`), on the interval
algebra of `intervals`. torch-free: these read plain data.
"""
