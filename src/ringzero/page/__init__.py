"""A run as one self-contained HTML page: start with `html.page` (what `ringzero train
--html-report` and `ringzero analyze --html-report` write); `charts` draws its figures as inline
SVG. torch-free: it reads a run report's plain data."""
