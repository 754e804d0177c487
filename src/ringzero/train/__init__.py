"""The training engine: ringzero's GPT, its data, the training loop and its reports."""
