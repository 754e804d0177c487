"""Communication: every collective's algorithms (`algorithms`, the one table), who talks to whom
(`schedules`, `chunks`), the exact bytes each rank moves (`volume`, one formula file per algorithm
in `volumes/`), their α-β-γ cost (`network`) and the messages on each link between nodes
(`links`, `links_recursive`). Start at `volume`."""
