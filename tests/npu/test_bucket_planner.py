"""The static-shape bucket planner (issue 17): `_native.BucketPlanner` against a
plain numpy reference of its rules (csrc/graph/bucket_planner.h) on random
token trees -- bucket choice, chunk splitting and each chunk's past, the packed
ids / positions / additive mask, and that a tree's chunks together attend
exactly what its mask allows -- plus every error, and `lever.npu.buckets`
(parse_buckets, BucketSet)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lever import _native
from lever.errors import LeverError
from lever.npu.buckets import DEFAULT_CONTEXTS, DEFAULT_ROWS, MASKED, BucketSet, parse_buckets
from lever.tree import TokenTree

BucketPlanner = _native.BucketPlanner
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None)


# ---------------------------------------------------------------------------
# The reference: the packing rules written out in numpy

def ref_choose(rows, contexts, n_rows, past):
    return min(r for r in rows if r >= n_rows), min(c for c in contexts if c >= past)


def ref_chunks(rows, contexts, n_rows, past):
    """[(start, end, rows, context)], or None if a chunk's past exceeds the largest context."""
    out = []
    for start in range(0, n_rows, max(rows)):
        end = min(start + max(rows), n_rows)
        if past + start > max(contexts):
            return None
        out.append((start, end, *ref_choose(rows, contexts, end - start, past + start)))
    return out


def ref_pack(tokens, positions, mask, past, start, end, N, C):
    n, P = end - start, past + start
    ids = np.zeros(N, np.int64)
    pos = np.zeros(N, np.int64)
    ids[:n], pos[:n] = tokens[start:end], positions[start:end]
    m = np.full((N, C + N), MASKED, np.float32)
    rows = mask[start:end]
    m[:n, :P] = np.where(rows[:, :P], 0.0, MASKED)          # the past (earlier chunks included)
    m[:n, C:C + n] = np.where(rows[:, P:P + n], 0.0, MASKED)  # this chunk's rows
    pad = np.arange(n, N)
    m[pad, C + pad] = 0.0                                     # padding rows attend only themselves
    return ids, pos, m


def random_tree(rng, n):
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    tokens = rng.choice(50_000, size=n, replace=False)
    return TokenTree.from_arrays(np.asarray(tokens, np.int64), np.asarray(parents, np.int64))


def tree_inputs(tree, past):
    return (tree.tokens().astype(np.int64), tree.positions(past), tree.mask(past))


def pack(planner, tokens, positions, mask, past, start, end, N, C):
    ids = np.full(N, -7, np.int64)
    pos = np.full(N, -7, np.int64)
    m = np.full((N, C + N), 123.0, np.float32)
    planner.pack(tokens, positions, mask, past, start, end, N, C, ids, pos, m)
    return ids, pos, m


bucket_lists = st.lists(st.integers(1, 40), min_size=1, max_size=5)


# ---------------------------------------------------------------------------
# Planner: buckets, choose, chunks

def test_buckets_sorted_and_deduped():
    p = BucketPlanner([16, 1, 8, 8], (256, 128, 256))
    assert p.rows == [1, 8, 16] and p.contexts == [128, 256]
    assert (p.max_rows, p.max_context) == (16, 256)
    assert BucketPlanner.MASKED == MASKED == np.float32(-1e4)
    assert "rows=[1, 8, 16]" in repr(p)


@SETTINGS
@given(rows=bucket_lists, contexts=bucket_lists, n_rows=st.integers(1, 40), past=st.integers(0, 40))
def test_choose_matches_reference(rows, contexts, n_rows, past):
    p = BucketPlanner(rows, contexts)
    if n_rows > max(rows) or past > max(contexts):
        with pytest.raises(ValueError, match="exceed the largest"):
            p.choose(n_rows, past)
    else:
        assert p.choose(n_rows, past) == ref_choose(rows, contexts, n_rows, past)


@SETTINGS
@given(rows=bucket_lists, contexts=bucket_lists, n_rows=st.integers(1, 200), past=st.integers(0, 60))
def test_chunks_match_reference(rows, contexts, n_rows, past):
    p = BucketPlanner(rows, contexts)
    want = ref_chunks(rows, contexts, n_rows, past)
    if want is None:
        with pytest.raises(ValueError, match="largest context bucket"):
            p.chunks(n_rows, past)
        return
    got = p.chunks(n_rows, past)
    assert got == want
    # Consecutive, covering [0, n_rows), each within the planner's largest row bucket.
    assert got[0][0] == 0 and got[-1][1] == n_rows
    assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
    assert all(0 < end - start <= p.max_rows for start, end, _, _ in got)


def test_chunks_split_300_rows():
    p = BucketPlanner(DEFAULT_ROWS, DEFAULT_CONTEXTS)
    assert p.chunks(300, 50) == [(0, 128, 128, 128), (128, 256, 128, 256), (256, 300, 64, 512)]
    assert p.chunks(5, 0) == [(0, 5, 8, 128)]
    assert p.chunks(256, 0) == [(0, 128, 128, 128), (128, 256, 128, 128)]
    assert p.chunks(129, 2048 - 128)[-1] == (128, 129, 1, 2048)   # the last chunk's past is 2048
    with pytest.raises(ValueError, match=r"chunk 1 \(rows \[128, 129\) of 129\)"):
        p.chunks(129, 2048 - 127)


# ---------------------------------------------------------------------------
# Pack

@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), T=st.integers(1, 70), past=st.integers(0, 30),
       rows=st.lists(st.integers(1, 32), min_size=1, max_size=4),
       extra_context=st.lists(st.integers(0, 40), min_size=1, max_size=3))
def test_pack_matches_reference_on_random_trees(seed, T, past, rows, extra_context):
    rng = np.random.default_rng(seed)
    tree = random_tree(rng, T)
    # Context buckets large enough for every chunk (past + T - 1 rows at most).
    contexts = [past + T + e for e in extra_context]
    p = BucketPlanner(rows, contexts)
    tokens, positions, mask = tree_inputs(tree, past)
    seen = np.zeros_like(mask)
    for start, end, N, C in p.chunks(T, past):
        got = pack(p, tokens, positions, mask, past, start, end, N, C)
        want = ref_pack(tokens, positions, mask, past, start, end, N, C)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        assert got[2].dtype == np.float32 and got[2].shape == (N, C + N)
        # Map the attended graph columns back to KV rows: past column j is KV row j,
        # new column C + k is KV row past + start + k.
        ids, _, m = got
        n, P = end - start, past + start
        assert ((m == 0.0).sum(axis=1) > 0).all()   # no all-masked row (padding rows included)
        for i in range(n):
            cols = np.flatnonzero(m[i] == 0.0)
            kv = np.where(cols < C, cols, P + cols - C)
            seen[start + i, kv] = True
    np.testing.assert_array_equal(seen, mask)   # the chunks attend exactly what the tree allows


def test_pack_300_row_tree_with_128_row_buckets():
    rng = np.random.default_rng(300)
    tree = random_tree(rng, 300)
    p = BucketPlanner(DEFAULT_ROWS, DEFAULT_CONTEXTS)
    past = 17
    tokens, positions, mask = tree_inputs(tree, past)
    chunks = p.chunks(300, past)
    assert [c[:2] for c in chunks] == [(0, 128), (128, 256), (256, 300)]
    for start, end, N, C in chunks:
        for g, w in zip(pack(p, tokens, positions, mask, past, start, end, N, C),
                        ref_pack(tokens, positions, mask, past, start, end, N, C)):
            np.testing.assert_array_equal(g, w)


def test_pack_regions_by_hand():
    # root(7) -> 8 -> 10, root -> 9; 3 cached rows; one (8, 16) bucket.
    tree = TokenTree.from_arrays(np.array([7, 8, 9, 10]), np.array([-1, 0, 0, 1]))
    tokens, positions, mask = tree_inputs(tree, 3)
    ids, pos, m = pack(BucketPlanner([8], [16]), tokens, positions, mask, 3, 0, 4, 8, 16)
    assert ids.tolist() == [7, 8, 9, 10, 0, 0, 0, 0]
    assert pos.tolist() == [3, 4, 4, 5, 0, 0, 0, 0]
    attended = [np.flatnonzero(row == 0.0).tolist() for row in m]
    assert attended[0] == [0, 1, 2, 16]
    assert attended[3] == [0, 1, 2, 16, 17, 19]          # cache, root, node 1, itself
    assert attended[5] == [21]                            # a padding row: only its own column
    assert set(np.unique(m).tolist()) == {0.0, float(MASKED)}


def test_pack_releases_the_gil_and_is_thread_safe():
    from concurrent.futures import ThreadPoolExecutor
    rng = np.random.default_rng(5)
    tree = random_tree(rng, 100)
    p = BucketPlanner([128], [256])
    tokens, positions, mask = tree_inputs(tree, 40)
    want = ref_pack(tokens, positions, mask, 40, 0, 100, 128, 256)
    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda _: pack(p, tokens, positions, mask, 40, 0, 100, 128, 256), range(8)))
    for got in results:
        np.testing.assert_array_equal(got[2], want[2])


# ---------------------------------------------------------------------------
# Errors

@pytest.mark.parametrize("rows, contexts, match", [
    ([], [128], "row buckets are empty"),
    ([1], [], "context buckets are empty"),
    ([0, 8], [128], "row bucket 0 must be >= 1"),
    ([8], [128, -5], "context bucket -5 must be >= 1"),
])
def test_constructor_errors(rows, contexts, match):
    with pytest.raises(ValueError, match=match):
        BucketPlanner(rows, contexts)


def test_choose_and_chunks_errors():
    p = BucketPlanner(DEFAULT_ROWS, DEFAULT_CONTEXTS)
    with pytest.raises(ValueError, match="n_rows must be >= 1, got 0"):
        p.choose(0, 0)
    with pytest.raises(ValueError, match="past must be >= 0, got -1"):
        p.choose(1, -1)
    with pytest.raises(ValueError, match=r"129 rows exceed the largest row bucket \(128\); split them with chunks"):
        p.choose(129, 0)
    with pytest.raises(ValueError, match=r"2049 rows of past exceed the largest context bucket \(2048\)"):
        p.choose(1, 2049)
    with pytest.raises(ValueError, match="n_rows must be >= 1"):
        p.chunks(0, 0)
    with pytest.raises(ValueError, match="past must be >= 0"):
        p.chunks(3, -2)
    with pytest.raises(ValueError, match=r"2049 rows of past exceed the largest context bucket"):
        p.chunks(3, 2049)
    with pytest.raises(ValueError, match=r"would run with 2000 \+ 128 rows of past, more than the largest"):
        p.chunks(300, 2000)


@pytest.fixture
def small():
    tree = TokenTree.from_arrays(np.array([7, 8, 9, 10]), np.array([-1, 0, 0, 1]))
    tokens, positions, mask = tree_inputs(tree, 3)
    outs = (np.zeros(8, np.int64), np.zeros(8, np.int64), np.zeros((8, 24), np.float32))
    return BucketPlanner([8], [16]), (tokens, positions, mask), outs


def _args(small, **change):
    p, (tokens, positions, mask), (ids, pos, m) = small
    a = dict(tokens=tokens, positions=positions, mask=mask, past=3, start=0, end=4, rows_bucket=8,
             context_bucket=16, ids_out=ids, positions_out=pos, mask_out=m)
    a.update(change)
    return p, a


@pytest.mark.parametrize("change, match", [
    # dtypes and layouts (checked by the binding)
    (dict(tokens=np.arange(4, dtype=np.int32)), "tokens must be a 1-D int64 array"),
    (dict(positions=np.arange(4.0)), "positions must be a 1-D int64 array"),
    (dict(mask=np.ones((4, 7), np.uint8)), "mask must be a 2-D bool array"),
    (dict(mask=np.ones((4, 7, 1), bool)), "mask must be 2-D, got 3 dimensions"),
    (dict(mask=np.ones((7, 4), bool).T), "mask must be C-contiguous"),
    (dict(ids_out=np.zeros((8, 1), np.int64)), "ids_out must be 1-D"),
    (dict(ids_out=np.zeros(16, np.int64)[::2]), "ids_out must be C-contiguous"),
    (dict(mask_out=np.zeros((8, 24), np.float64)), "mask_out must be a 2-D float32 array"),
    # shapes and ranges (checked by the planner)
    (dict(past=-1), "past must be >= 0"),
    (dict(start=-1), r"rows \[-1, 4\) must be a non-empty range within the tree's 4 rows"),
    (dict(start=2, end=2), "non-empty range"),
    (dict(end=5), "non-empty range"),
    (dict(positions=np.arange(3, dtype=np.int64)), "positions has 3 entries, expected 4"),
    (dict(mask=np.ones((3, 7), bool)), r"mask has shape \(3, 7\), expected \(4, past \+ 4\)"),
    (dict(past=2), r"mask has shape \(4, 7\), expected \(4, past \+ 4\) with past = 2"),
    (dict(rows_bucket=0), "rows_bucket must be >= 1"),
    (dict(context_bucket=-1), "context_bucket >= 0"),
    (dict(rows_bucket=2), "4 rows do not fit the row bucket 2"),
    (dict(start=1, context_bucket=3), r"4 rows of past \(3 \+ start 1\) do not fit the context bucket 3"),
    (dict(ids_out=np.zeros(7, np.int64)), r"ids_out has 7 entries, expected 8 \(rows_bucket\)"),
    (dict(positions_out=np.zeros(9, np.int64)), "positions_out has 9 entries, expected 8"),
    (dict(mask_out=np.zeros((7, 24), np.float32)), r"mask_out has shape \(7, 24\), expected \(8, 16 \+ 8\)"),
    (dict(context_bucket=15), r"mask_out has shape \(8, 24\), expected \(8, 15 \+ 8\)"),
])
def test_pack_errors(small, change, match):
    p, a = _args(small, **change)
    with pytest.raises(ValueError, match=match):
        p.pack(**a)


def test_pack_rejects_readonly_outputs(small):
    out = np.zeros(8, np.int64)
    out.setflags(write=False)
    p, a = _args(small, ids_out=out)
    with pytest.raises(ValueError, match="ids_out must be writable"):
        p.pack(**a)


def test_pack_rejects_attending_a_later_chunk_and_writes_nothing(small):
    p, a = _args(small)
    mask = a["mask"].copy()
    mask[1, 3 + 3] = True   # row 1 attends tree row 3, which chunk [0, 2) does not hold
    outs = (np.full(8, -7, np.int64), np.full(8, -7, np.int64), np.full((8, 24), 123.0, np.float32))
    a.update(mask=mask, end=2, ids_out=outs[0], positions_out=outs[1], mask_out=outs[2])
    with pytest.raises(ValueError, match=r"tree row 1 attends column 6 \(tree row 3\), which is not in this "
                                         r"chunk \(rows \[0, 2\)\) or an earlier one"):
        p.pack(**a)
    assert (outs[0] == -7).all() and (outs[1] == -7).all() and (outs[2] == 123.0).all()
    a.update(end=4)   # the whole tree in one chunk: fine
    p.pack(**a)


# ---------------------------------------------------------------------------
# lever.npu.buckets

def test_parse_buckets():
    assert parse_buckets("1,8,16") == (1, 8, 16)
    assert parse_buckets(" 16, 1 ,8,8, ") == (1, 8, 16)
    assert parse_buckets([32, 8, np.int64(8)]) == (8, 32)


@pytest.mark.parametrize("text, match", [
    ("", "no bucket sizes given"),
    ("  ", "no bucket sizes given"),
    ("1,,8", "an empty entry is not a positive integer"),
    ("abc", "'abc' is not a positive integer"),
    ("0,8", "'0' is not a positive integer"),
    ("-3", "'-3' is not a positive integer"),
    ("1.5", "'1.5' is not a positive integer"),
    ("8;16", "'8;16' is not a positive integer"),
    ([8, 0], "must be positive integers"),
    ([8, 2.0], "must be positive integers"),
    ([True], "must be positive integers"),
    ([], "are empty"),
])
def test_parse_buckets_errors(text, match):
    with pytest.raises(LeverError, match=match):
        parse_buckets(text)


def test_parse_buckets_names_the_option():
    with pytest.raises(LeverError, match="cannot read the context buckets 'x'"):
        BucketSet.parse(contexts="x")


def test_bucket_set():
    b = BucketSet()
    assert b.rows == DEFAULT_ROWS and b.contexts == DEFAULT_CONTEXTS
    assert b.planner.rows == list(DEFAULT_ROWS) and b.planner.contexts == list(DEFAULT_CONTEXTS)
    assert (b.max_rows, b.max_context) == (128, 2048)
    s = BucketSet((16, 1, 8, 8), [256, 128])
    assert s.rows == (1, 8, 16) and s.contexts == (128, 256)
    assert s.key() == "r1-8-16_c128-256"
    assert s.shapes()[:3] == [(1, 128), (1, 256), (8, 128)]
    assert BucketSet.from_json(s.to_json()) == s
    assert s.to_json() == {"rows": [1, 8, 16], "contexts": [128, 256]}
    assert hash(BucketSet.parse("16,8,1", "128,256")) == hash(s)
    assert BucketSet.parse("1,8") == BucketSet((1, 8), DEFAULT_CONTEXTS)
    assert s != b
    assert "rows=(1, 8, 16)" in repr(s)


@pytest.mark.parametrize("d, match", [
    ([1, 2], "a mapping with 'rows' and 'contexts'"),
    ({"rows": [1]}, "a mapping with 'rows' and 'contexts'"),
    ({"rows": "1,8", "contexts": [128]}, "must be lists of positive integers"),
    ({"rows": [1], "contexts": ["128"]}, "context buckets must be positive integers"),
    ({"rows": [], "contexts": [128]}, "row buckets are empty"),
])
def test_bucket_set_from_json_errors(d, match):
    with pytest.raises(LeverError, match=match):
        BucketSet.from_json(d)
