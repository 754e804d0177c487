"""The model's side of a plan: shapes and parameter counts (`shapes`), FLOPs per token (`flops`),
activation bytes (`activations`), named presets (`presets`) and one GPU's compute time for a
shape (`compute`). Start at `shapes`."""
