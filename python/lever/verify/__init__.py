"""Exact acceptance rules: given a drafted tree and the target's logits per node,
decide which drafted tokens the target would have produced itself."""
