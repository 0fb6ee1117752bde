"""Named experiments built from the model, data, training and evaluation."""
