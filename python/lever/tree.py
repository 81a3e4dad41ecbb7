"""Draft token trees for speculative decoding (native: csrc/tree/token_tree.h).

`TokenTree` holds the draft tree that one target pass verifies.

Conventions
-----------
- **Index order is the batch order.** Nodes are numbered ``0..n-1`` and the
  verification batch is the nodes in that order.
- **Node 0 is the root**: the last committed token (the target's token from
  the previous pass), whose KV is *not* yet in the cache. ``depth(0) == 0``,
  ``parent(0) == -1``, ``logprob(0) == 0``.
- **Every other node is a draft token** whose parent has a smaller index, so
  index order is a topological order. Siblings carry distinct tokens.
- **KV layout**: the cache holds ``n_cached`` committed rows, then the tree's
  ``n`` rows (node ``i`` in row ``n_cached + i``).
- **Units**: tokens are vocabulary ids (int32, >= 0); log-probs are natural
  logs of the draft probability of a node given its parent
  (``path_logprob(i)`` sums them along root..i); positions are token
  positions in the sequence.

Verification inputs
-------------------
- ``mask(n_cached)``: new numpy bool array ``[n, n_cached + n]``, row-major,
  ``True`` = may attend. Row ``i`` is True on all ``n_cached`` cached columns
  and, among the tree columns ``n_cached + j``, exactly on ``i``'s ancestors
  and ``i`` itself.
- ``positions(n_cached)``: new numpy int64 array ``[n]``,
  ``n_cached + depth(i)``.

Acceptance
----------
- ``walk(tokens_per_node)`` -> ``(accepted_nodes, next_token)``: the target's
  token per node (int32/int64 ``[n]``; greedy: the argmax at each node). From
  the root, descend while the current node's target token is one of its
  children's tokens. ``accepted_nodes`` (a list, root excluded) are the nodes
  descended to; ``next_token`` is the target token where the walk stopped (the
  next root). Only visited entries are read.
- The sampling walk draws a token at each visited node in Python and steps
  with ``child_with_token(node, token)`` (-1: stop).
- ``compaction_indices(n_cached, accepted_nodes)`` -> int64 rows to keep:
  ``0..n_cached-1``, ``n_cached`` (the root), then ``n_cached + j`` for each
  accepted node ``j`` (strictly increasing).

Errors: malformed input raises ValueError (naming the bad node, e.g.
``node 5: parent 7 is not before it``, ``node 4 repeats token 123 under
parent 1``); a node index out of range raises IndexError.
"""

from lever._native import TokenTree

__all__ = ["TokenTree"]
