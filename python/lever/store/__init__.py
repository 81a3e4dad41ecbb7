"""The flash-resident store: a model's weights as aligned extents in one file."""
