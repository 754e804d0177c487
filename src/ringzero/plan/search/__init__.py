"""Choosing a configuration: `space.search` tries every split of a run over a GPU budget and ranks
what fits (start there); `result` holds what it found (`SearchResult`) and explains the choice
against the runner-up in the words of `why`; `recommend` is the layout `--layout auto` runs,
`layout_check` whether a layout can exist at all, `limits` the largest inputs answered in about a
second."""
