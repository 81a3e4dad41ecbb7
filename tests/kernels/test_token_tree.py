"""Native TokenTree (csrc/tree/token_tree.h) against a plain-Python reference,
on many random trees: structure, mask, positions, walk, compaction, pruning,
and rejection of malformed trees (messages checked)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from lever._native import TokenTree

MAX_DEPTH = 8
MAX_NODES = 300
MAX_CACHED = 50
SEEDS = range(60)


# --- Reference -----------------------------------------------------------------

class RefTree:
    """Plain-Python token tree, straight from the definitions."""

    def __init__(self, tokens, parents, logprobs=None):
        self.tokens = [int(t) for t in tokens]
        self.parents = [int(p) for p in parents]
        n = len(self.tokens)
        lp = [0.0] * n if logprobs is None else [float(np.float32(x)) for x in logprobs]
        lp[0] = 0.0
        self.logprobs = lp
        self.n = n

    def depth(self, i):
        d = 0
        while self.parents[i] != -1:
            i = self.parents[i]
            d += 1
        return d

    def path(self, i):
        out = [i]
        while self.parents[i] != -1:
            i = self.parents[i]
            out.append(i)
        return out[::-1]

    def path_logprob(self, i):
        total = np.float32(0.0)
        for v in self.path(i)[1:]:  # same order as the native sum: root to leaf
            total = np.float32(total + np.float32(self.logprobs[v]))
        return float(total)

    def children(self, i):
        return [j for j in range(self.n) if self.parents[j] == i]

    def child_with_token(self, i, token):
        for c in self.children(i):
            if self.tokens[c] == token:
                return c
        return -1

    def is_ancestor(self, a, b):
        return a in self.path(b)

    def mask(self, n_cached):
        m = np.zeros((self.n, n_cached + self.n), dtype=bool)
        m[:, :n_cached] = True
        for i in range(self.n):
            for j in self.path(i):
                m[i, n_cached + j] = True
        return m

    def positions(self, n_cached):
        return np.array([n_cached + self.depth(i) for i in range(self.n)], dtype=np.int64)

    def walk(self, targets):
        accepted, cur = [], 0
        while True:
            t = int(targets[cur])
            c = self.child_with_token(cur, t)
            if c < 0:
                return accepted, t
            accepted.append(c)
            cur = c

    def compaction(self, n_cached, accepted):
        return np.array(list(range(n_cached)) + [n_cached] + [n_cached + j for j in accepted],
                        dtype=np.int64)

    def prune(self, keep):
        old_to_new = [-1] * self.n
        tokens, parents, logprobs = [], [], []
        for i in range(self.n):
            p = self.parents[i]
            if keep[i] and (p == -1 or old_to_new[p] >= 0):
                old_to_new[i] = len(tokens)
                tokens.append(self.tokens[i])
                parents.append(-1 if p == -1 else old_to_new[p])
                logprobs.append(self.logprobs[i])
        return RefTree(tokens, parents, logprobs), old_to_new


# --- Random trees ----------------------------------------------------------------

SHAPES = ["uniform", "chain", "bushy", "recent", "wide-then-deep"]


def random_tree(rng, n=None, max_depth=None, shape=None):
    """(tokens, parents, logprobs) of a valid tree: parents before children,
    depth <= max_depth, distinct sibling tokens from a small vocabulary (so
    random targets often hit)."""
    n = int(rng.integers(1, MAX_NODES + 1)) if n is None else n
    max_depth = int(rng.integers(1, MAX_DEPTH + 1)) if max_depth is None else max_depth
    shape = SHAPES[int(rng.integers(len(SHAPES)))] if shape is None else shape
    vocab = int(rng.integers(4, 40))
    tokens = [int(rng.integers(0, 100_000))]
    parents = [-1]
    depths = [0]
    child_tokens: list[set] = [set()]
    while len(tokens) < n:
        i = len(tokens)
        open_nodes = [v for v in range(i) if depths[v] < max_depth]
        if shape == "chain":
            p = open_nodes[-1]
        elif shape == "bushy":
            p = open_nodes[int(rng.integers(min(3, len(open_nodes))))]
        elif shape == "recent":
            p = open_nodes[max(0, len(open_nodes) - 1 - int(rng.geometric(0.3)))]
        elif shape == "wide-then-deep":
            p = 0 if i < 8 else open_nodes[int(rng.integers(len(open_nodes)))]
        else:
            p = open_nodes[int(rng.integers(len(open_nodes)))]
        free = [t for t in range(vocab) if t not in child_tokens[p]]
        t = int(rng.choice(free)) if free else vocab + len(child_tokens[p])
        tokens.append(t)
        parents.append(p)
        depths.append(depths[p] + 1)
        child_tokens[p].add(t)
        child_tokens.append(set())
    logprobs = (-rng.exponential(1.0, size=n)).astype(np.float32)
    logprobs[0] = 0.0
    return tokens, parents, logprobs


def build(rng, **kw):
    tokens, parents, logprobs = random_tree(rng, **kw)
    tree = TokenTree.from_arrays(np.array(tokens, dtype=np.int32),
                                 np.array(parents, dtype=np.int32), logprobs)
    return tree, RefTree(tokens, parents, logprobs)


def targets_to(ref, rng, node, vocab_hi=60):
    """Targets that make the walk descend from the root to `node` and stop
    there (the target at `node` is not a child token); other entries random."""
    targets = rng.integers(0, vocab_hi, size=ref.n).astype(np.int64)
    path = ref.path(node)
    for a, b in zip(path, path[1:]):
        targets[a] = ref.tokens[b]
    child_tokens = {ref.tokens[c] for c in ref.children(node)}
    stop = int(rng.integers(0, 100_000))
    while stop in child_tokens:
        stop += 1
    targets[node] = stop
    return targets


# --- Structure -------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_structure_matches_reference(seed):
    rng = np.random.default_rng(seed)
    tree, ref = build(rng)
    n = ref.n
    assert tree.size() == len(tree) == n
    np.testing.assert_array_equal(tree.tokens(), ref.tokens)
    np.testing.assert_array_equal(tree.parents(), ref.parents)
    depths = [ref.depth(i) for i in range(n)]
    np.testing.assert_array_equal(tree.depths(), depths)
    assert tree.tokens().dtype == np.int32 and tree.parents().dtype == np.int32
    assert tree.max_depth() == max(depths)
    for i in range(n):
        assert tree.token(i) == ref.tokens[i]
        assert tree.parent(i) == ref.parents[i]
        assert tree.depth(i) == depths[i]
        assert tree.path(i) == ref.path(i)
        assert tree.children(i) == ref.children(i)
        assert tree.num_children(i) == len(ref.children(i))
        assert tree.logprob(i) == ref.logprobs[i]
        assert tree.path_logprob(i) == ref.path_logprob(i)
    np.testing.assert_array_equal(tree.logprobs(), np.array(ref.logprobs, dtype=np.float32))
    np.testing.assert_array_equal(tree.path_logprobs(),
                                  [ref.path_logprob(i) for i in range(n)])
    assert tree.leaves() == [i for i in range(n) if not ref.children(i)]
    for d in range(MAX_DEPTH + 2):
        assert tree.nodes_at_depth(d) == [i for i in range(n) if depths[i] == d]
    for _ in range(200):
        a, b = (int(x) for x in rng.integers(0, n, size=2))
        assert tree.is_ancestor(a, b) == ref.is_ancestor(a, b)
    for i in range(n):
        assert tree.is_ancestor(0, i) and tree.is_ancestor(i, i)
    for _ in range(100):
        i, t = int(rng.integers(0, n)), int(rng.integers(0, 45))
        assert tree.child_with_token(i, t) == ref.child_with_token(i, t)
    for c in range(1, n):
        assert tree.child_with_token(ref.parents[c], ref.tokens[c]) == c


@pytest.mark.parametrize("seed", range(10))
def test_add_builds_the_same_tree_as_from_arrays(seed):
    rng = np.random.default_rng(1000 + seed)
    tokens, parents, logprobs = random_tree(rng)
    tree = TokenTree(tokens[0], capacity_hint=4)  # grows past the hint
    for i in range(1, len(tokens)):
        assert tree.add(parents[i], tokens[i], float(logprobs[i])) == i
    other = TokenTree.from_arrays(tokens, parents, logprobs)
    np.testing.assert_array_equal(tree.tokens(), other.tokens())
    np.testing.assert_array_equal(tree.parents(), other.parents())
    np.testing.assert_array_equal(tree.depths(), other.depths())
    np.testing.assert_array_equal(tree.logprobs(), other.logprobs())
    np.testing.assert_array_equal(tree.path_logprobs(), other.path_logprobs())


def test_root_only_tree():
    tree = TokenTree(7)
    assert len(tree) == 1 and tree.token(0) == 7 and tree.parent(0) == -1
    assert tree.depth(0) == 0 and tree.max_depth() == 0 and tree.logprob(0) == 0.0
    assert tree.children(0) == [] and tree.leaves() == [0] and tree.path(0) == [0]
    np.testing.assert_array_equal(tree.mask(3), [[True, True, True, True]])
    np.testing.assert_array_equal(tree.positions(3), [3])
    assert tree.walk(np.array([9], dtype=np.int32)) == ([], 9)
    np.testing.assert_array_equal(tree.compaction_indices(3, []), [0, 1, 2, 3])
    assert "size=1" in repr(tree)


def test_from_arrays_accepts_lists_and_integer_dtypes():
    tokens, parents = [5, 6, 7, 8], [-1, 0, 0, 1]
    for dt in (np.int32, np.int64, np.int16):
        tree = TokenTree.from_arrays(np.array(tokens, dtype=dt), np.array(parents, dtype=dt))
        np.testing.assert_array_equal(tree.parents(), parents)
    tree = TokenTree.from_arrays(tokens, np.array(parents, dtype=np.int32))  # mixed
    np.testing.assert_array_equal(tree.tokens(), tokens)
    assert tree.logprobs().tolist() == [0.0] * 4
    tree = TokenTree.from_arrays(tokens, parents, [0.0, -0.5, -1.0, -0.25])
    assert tree.path_logprob(3) == -0.75
    assert tree.logprob(0) == 0.0  # the root's entry is ignored


# --- Mask and positions ----------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_mask_and_positions_match_reference(seed):
    rng = np.random.default_rng(seed)
    tree, ref = build(rng)
    for n_cached in {0, int(rng.integers(0, MAX_CACHED + 1)), MAX_CACHED}:
        mask = tree.mask(n_cached)
        assert mask.dtype == np.bool_ and mask.shape == (ref.n, n_cached + ref.n)
        assert mask.flags.c_contiguous and mask.flags.writeable
        np.testing.assert_array_equal(mask, ref.mask(n_cached))
        pos = tree.positions(n_cached)
        assert pos.dtype == np.int64 and pos.shape == (ref.n,)
        np.testing.assert_array_equal(pos, ref.positions(n_cached))


def test_mask_small_example():
    # root 0 -> 1 -> 3, root 0 -> 2
    tree = TokenTree.from_arrays([10, 11, 12, 13], [-1, 0, 0, 1])
    expected = np.array([
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 0, 1, 0],
        [1, 1, 1, 1, 0, 1],
    ], dtype=bool)
    np.testing.assert_array_equal(tree.mask(2), expected)
    np.testing.assert_array_equal(tree.positions(2), [2, 3, 3, 4])


def test_mask_arrays_are_independent():
    tree = TokenTree.from_arrays([1, 2, 3], [-1, 0, 1])
    a = tree.mask(4)
    a[:] = False
    assert tree.mask(4)[2].all()


# --- Walk and compaction ---------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_walk_random_targets(seed):
    rng = np.random.default_rng(seed)
    tree, ref = build(rng)
    for trial in range(30):
        targets = rng.integers(0, 45, size=ref.n)
        if trial % 2:  # mostly follow some child, so walks go deep
            for i in range(ref.n):
                kids = ref.children(i)
                if kids and rng.random() < 0.85:
                    targets[i] = ref.tokens[kids[int(rng.integers(len(kids)))]]
        expected = ref.walk(targets)
        for dt in (np.int32, np.int64):
            assert tree.walk(targets.astype(dt)) == expected
        assert tree.walk(targets.tolist()) == expected


@pytest.mark.parametrize("seed", SEEDS)
def test_walk_reaches_chosen_deep_node(seed):
    rng = np.random.default_rng(seed)
    tree, ref = build(rng, shape=["recent", "chain", "uniform"][seed % 3])
    deepest = max(range(ref.n), key=ref.depth)
    nodes = [deepest] + [int(x) for x in rng.integers(0, ref.n, size=20)]
    for node in nodes:
        targets = targets_to(ref, rng, node)
        accepted, next_token = tree.walk(targets)
        assert accepted == ref.path(node)[1:]
        assert next_token == targets[node]
        n_cached = int(rng.integers(0, MAX_CACHED + 1))
        rows = tree.compaction_indices(n_cached, accepted)
        assert rows.dtype == np.int64
        np.testing.assert_array_equal(rows, ref.compaction(n_cached, accepted))
        assert np.all(np.diff(rows) > 0)
        assert len(rows) == n_cached + 1 + ref.depth(node)
        np.testing.assert_array_equal(tree.compaction_indices(n_cached, np.array(accepted)),
                                      rows)


def test_walk_reads_only_visited_nodes():
    tree = TokenTree.from_arrays([0, 5, 6, 7], [-1, 0, 0, 1])
    # Nodes 2 and 3 are never visited: their (invalid) entries are not read.
    assert tree.walk(np.array([5, 9, -1, -1], dtype=np.int64)) == ([1], 9)
    assert tree.walk(np.array([5, 7, -1, 3], dtype=np.int32)) == ([1, 3], 3)
    assert tree.walk(np.array([6, -5, 4, -1])) == ([2], 4)


def test_stepwise_walk_equals_walk():
    """The sampling walk in Python: step with child_with_token."""
    rng = np.random.default_rng(7)
    for _ in range(50):
        tree, ref = build(rng)
        targets = rng.integers(0, 45, size=ref.n)
        node, accepted = 0, []
        while (child := tree.child_with_token(node, int(targets[node]))) >= 0:
            accepted.append(child)
            node = child
        assert tree.walk(targets) == (accepted, int(targets[node]))


def test_walk_rejects_bad_targets():
    tree = TokenTree.from_arrays([0, 5, 6], [-1, 0, 0])
    with pytest.raises(ValueError, match="tokens_per_node has 2 entries, expected 3"):
        tree.walk(np.array([5, 1], dtype=np.int32))
    with pytest.raises(ValueError, match="tokens_per_node has the wrong dtype"):
        tree.walk(np.array([5.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="int32 or int64"):
        tree.walk(np.array([5, 1, 2], dtype=np.int16))
    with pytest.raises(ValueError, match="must be 1-D"):
        tree.walk(np.zeros((3, 1), dtype=np.int64))
    with pytest.raises(ValueError, match="target token -1 at visited node 1"):
        tree.walk(np.array([5, -1, 0], dtype=np.int32))
    with pytest.raises(ValueError, match="target token 4294967296 at visited node 0"):
        tree.walk(np.array([2**32, 0, 0], dtype=np.int64))


def test_compaction_rejects_non_paths():
    tree = TokenTree.from_arrays([0, 5, 6, 7, 8], [-1, 0, 0, 1, 2])
    np.testing.assert_array_equal(tree.compaction_indices(2, [2, 4]), [0, 1, 2, 4, 6])
    with pytest.raises(ValueError, match=r"not a path from the root: node 3 \(entry 0\) has "
                                         r"parent 1, expected 0"):
        tree.compaction_indices(2, [3])
    with pytest.raises(ValueError, match="node 4 .entry 1. has parent 2, expected 1"):
        tree.compaction_indices(2, [1, 4])
    with pytest.raises(ValueError, match="accepted node 0 .entry 0. is not a draft node"):
        tree.compaction_indices(2, [0])
    with pytest.raises(ValueError, match="accepted node 5 .entry 0. is not a draft node"):
        tree.compaction_indices(2, [5])
    with pytest.raises(ValueError, match="n_cached must be >= 0, got -1"):
        tree.compaction_indices(-1, [])


def test_negative_n_cached_rejected():
    tree = TokenTree.from_arrays([0, 5], [-1, 0])
    with pytest.raises(ValueError, match="n_cached must be >= 0, got -3"):
        tree.mask(-3)
    with pytest.raises(ValueError, match="n_cached must be >= 0, got -3"):
        tree.positions(-3)


# --- Malformed trees -------------------------------------------------------------

def test_parent_not_before_node_rejected():
    tokens = list(range(100, 108))
    parents = [-1, 0, 1, 2, 3, 7, 4, 5]
    with pytest.raises(ValueError, match=re.escape("node 5: parent 7 is not before it")):
        TokenTree.from_arrays(tokens, parents)
    with pytest.raises(ValueError, match=re.escape("node 3: parent 3 is not before it")):
        TokenTree.from_arrays([1, 2, 3, 4], [-1, 0, 1, 3])
    with pytest.raises(ValueError, match=re.escape("node 2: parent -1 is negative")):
        TokenTree.from_arrays([1, 2, 3], [-1, 0, -1])
    with pytest.raises(ValueError, match=re.escape("node 0: parent 0 given, the root's parent "
                                                   "must be -1")):
        TokenTree.from_arrays([1, 2], [0, 0])


def test_duplicate_sibling_tokens_rejected():
    tokens = [9, 1, 123, 60, 123, 123]
    parents = [-1, 0, 1, 1, 1, 2]
    with pytest.raises(ValueError,
                       match=re.escape("node 4 repeats token 123 under parent 1 (as node 2)")):
        TokenTree.from_arrays(tokens, parents)
    # The same token under different parents (or equal to the parent's) is fine.
    tree = TokenTree.from_arrays([9, 123, 123, 123], [-1, 0, 1, 2])
    assert tree.max_depth() == 3
    t = TokenTree(9)
    t.add(0, 123)
    with pytest.raises(ValueError, match=re.escape("add: parent 0 already has a child with "
                                                   "token 123 (node 1)")):
        t.add(0, 123)
    assert len(t) == 2  # the failed add left the tree unchanged


@pytest.mark.parametrize("seed", range(40))
def test_random_corruptions_rejected_with_first_bad_node(seed):
    rng = np.random.default_rng(500 + seed)
    tokens, parents, _ = random_tree(rng, n=int(rng.integers(3, MAX_NODES + 1)))
    n = len(tokens)
    # A parent at or after its node.
    bad = list(parents)
    i = int(rng.integers(1, n))
    bad[i] = int(rng.integers(i, n + 5))
    with pytest.raises(ValueError, match=re.escape(f"node {i}: parent {bad[i]} is not before it")):
        TokenTree.from_arrays(tokens, bad)
    # A token repeated among siblings: copy an earlier sibling's token.
    with_earlier_sibling = [j for j in range(1, n)
                            if any(parents[k] == parents[j] for k in range(1, j))]
    if with_earlier_sibling:
        j = with_earlier_sibling[int(rng.integers(len(with_earlier_sibling)))]
        sib = next(k for k in range(1, j) if parents[k] == parents[j])
        dup = list(tokens)
        dup[j] = tokens[sib]
        # No earlier duplicate exists (the tree was valid), so j is the first bad node.
        with pytest.raises(ValueError, match=re.escape(
                f"node {j} repeats token {tokens[sib]} under parent {parents[j]}")):
            TokenTree.from_arrays(dup, parents)
    else:  # a pure chain: every node is its parent's only child
        assert all(parents[k] == k - 1 for k in range(1, n))


def test_bad_arrays_rejected():
    with pytest.raises(ValueError, match="no nodes"):
        TokenTree.from_arrays(np.array([], dtype=np.int32), np.array([], dtype=np.int32))
    with pytest.raises(ValueError, match="parents has 2 entries, expected 3"):
        TokenTree.from_arrays([1, 2, 3], [-1, 0])
    with pytest.raises(ValueError, match="logprobs has 1 entries, expected 2"):
        TokenTree.from_arrays([1, 2], [-1, 0], [0.0])
    with pytest.raises(ValueError, match="tokens has the wrong dtype"):
        TokenTree.from_arrays(np.array([1.0, 2.0]), [-1, 0])
    with pytest.raises(ValueError, match="must be 1-D"):
        TokenTree.from_arrays(np.zeros((2, 2), dtype=np.int32), [-1, 0])
    with pytest.raises(ValueError, match=re.escape("node 1: token -4 is negative")):
        TokenTree.from_arrays([1, -4], [-1, 0])
    with pytest.raises(ValueError, match=re.escape("node 2: token 3000000000 does not fit in "
                                                   "int32")):
        TokenTree.from_arrays(np.array([1, 2, 3_000_000_000]), np.array([-1, 0, 0]))
    with pytest.raises(ValueError, match="root: token -1 is negative"):
        TokenTree(-1)


def test_add_rejects_bad_parent_and_token():
    tree = TokenTree(1)
    tree.add(0, 2)
    with pytest.raises(ValueError, match=re.escape("add: parent 2 is out of range (the tree has "
                                                   "2 nodes)")):
        tree.add(2, 3)
    with pytest.raises(ValueError, match="add: parent -1 is out of range"):
        tree.add(-1, 3)
    with pytest.raises(ValueError, match="add: new node 2: token -7 is negative"):
        tree.add(1, -7)
    assert len(tree) == 2


def test_node_index_out_of_range_is_index_error():
    tree = TokenTree.from_arrays([1, 2], [-1, 0])
    for fn in (tree.token, tree.parent, tree.depth, tree.logprob, tree.path_logprob,
               tree.children, tree.path, tree.num_children):
        with pytest.raises(IndexError, match=re.escape("node 2 is out of range (the tree has 2 "
                                                       "nodes)")):
            fn(2)
        with pytest.raises(IndexError, match="node -1 is out of range"):
            fn(-1)
    with pytest.raises(IndexError):
        tree.child_with_token(5, 1)
    with pytest.raises(IndexError):
        tree.is_ancestor(0, 9)


# --- Pruning ---------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_subtree_prune_matches_reference(seed):
    rng = np.random.default_rng(seed)
    tree, ref = build(rng)
    for p_keep in (0.95, 0.7, 0.3):
        keep = rng.random(ref.n) < p_keep
        keep[0] = True
        new, old_to_new = tree.subtree_prune(keep)
        ref_new, ref_map = ref.prune(keep)
        assert old_to_new.dtype == np.int64 and old_to_new.shape == (ref.n,)
        np.testing.assert_array_equal(old_to_new, ref_map)
        assert len(new) == ref_new.n
        np.testing.assert_array_equal(new.tokens(), ref_new.tokens)
        np.testing.assert_array_equal(new.parents(), ref_new.parents)
        np.testing.assert_array_equal(new.logprobs(), np.array(ref_new.logprobs, np.float32))
        kept = np.flatnonzero(old_to_new >= 0)
        # Order kept: the new index of the k-th kept node is k.
        np.testing.assert_array_equal(old_to_new[kept], np.arange(len(kept)))
        for old in kept:
            nw = int(old_to_new[old])
            assert new.token(nw) == tree.token(old)
            assert new.depth(nw) == tree.depth(old)
            assert new.path_logprob(nw) == tree.path_logprob(old)
            if old:
                assert new.parent(nw) == old_to_new[tree.parent(old)]
        # A node survives iff it and all its ancestors are kept.
        for old in range(ref.n):
            assert (old_to_new[old] >= 0) == all(keep[a] for a in ref.path(old))
        np.testing.assert_array_equal(new.mask(5), ref_new.mask(5))
    new, old_to_new = tree.subtree_prune([True] * ref.n)
    np.testing.assert_array_equal(new.tokens(), tree.tokens())
    np.testing.assert_array_equal(old_to_new, np.arange(ref.n))
    new, old_to_new = tree.subtree_prune([True] + [False] * (ref.n - 1))
    assert len(new) == 1 and old_to_new[0] == 0 and (old_to_new[1:] == -1).all()


def test_subtree_prune_rejects_bad_masks():
    tree = TokenTree.from_arrays([1, 2, 3], [-1, 0, 1])
    with pytest.raises(ValueError, match=re.escape("the root (node 0) cannot be dropped")):
        tree.subtree_prune(np.array([False, True, True]))
    with pytest.raises(ValueError, match="keep_mask has 2 entries, expected 3"):
        tree.subtree_prune(np.array([True, True]))
    with pytest.raises(ValueError, match="keep_mask has the wrong dtype"):
        tree.subtree_prune(np.array([1, 1, 0]))


def test_lever_tree_reexports_native_class():
    import lever.tree

    assert lever.tree.TokenTree is TokenTree
    assert "Node 0 is the root" in lever.tree.__doc__
