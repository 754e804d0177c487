"""Choosing a configuration: `space.search` tries every split of a run over a GPU budget and ranks
what fits (start there), `why` explains the choice against the runner-up, `recommend` the layout
`--layout auto` runs, `layout_check` whether a layout can exist at all, `limits` the largest
inputs answered in about a second."""
