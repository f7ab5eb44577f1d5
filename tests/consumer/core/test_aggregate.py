"""PartialAggregator against independent references: DuckDB SQL and plain Python."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from consumer.core.aggregate import _STREAMING_MERGE_FROM_ROWS, PartialAggregator
from consumer.core.decode import Decoder, poll_frame
from consumer.core.plan import AggregationPlan, derive_plan
from consumer.core.windows.store import WindowStore
from wire.input import DecodeLimits, dictionary_keys, encode_ipc_stream

# -- the random-rows property -------------------------------------------------------------


def polars_schema(schema: pa.Schema) -> pl.Schema:
    empty = pl.from_arrow(schema.empty_table())
    assert isinstance(empty, pl.DataFrame)
    return empty.schema


INPUT_SCHEMA = pa.schema([
    ("host", pa.string()), ("region", pa.large_string()), ("bytes_sum", pa.int64()),
    ("lat_min", pa.int32()), ("lat_max", pa.float64()), ("temp", pa.float64()),
    ("hits", pa.int64()), ("avg_x", pa.float64()), ("label", pa.string()), ("code", pa.int16()),
])
ROW_SCHEMA = polars_schema(INPUT_SCHEMA.insert(0, pa.field("window_start", pa.int64())))
PLAN = derive_plan(
    INPUT_SCHEMA,
    keys=["host", "region"],
    overrides={"hits": "count", "avg_x": "mean", "label": "first", "code": "last"},
)
GROUP_BY = ("window_start", "host", "region")

# ORDER BY the arrival ordinal makes DuckDB's first/last follow arrival order.
REFERENCE_SQL = """
SELECT window_start, host, region,
       CAST(SUM(bytes_sum) AS BIGINT) AS bytes_sum,
       MIN(lat_min) AS lat_min,
       MAX(lat_max) AS lat_max,
       SUM(temp) AS temp,
       COUNT(hits) AS hits,
       AVG(avg_x) AS avg_x,
       FIRST(label ORDER BY ord) AS label,
       LAST(code ORDER BY ord) AS code,
       COUNT(*) AS row_count
FROM rows
GROUP BY window_start, host, region
"""

keys = st.none() | st.sampled_from(["a", "b", "ü", "b c"])
floats = st.none() | st.floats(-1e6, 1e6, allow_nan=False)
rows_strategy = st.lists(
    st.tuples(
        st.integers(0, 2), keys, keys,
        st.none() | st.integers(-(2**40), 2**40), st.none() | st.integers(-(2**31), 2**31 - 1),
        floats, floats, st.none() | st.integers(-(2**63), 2**63 - 1), floats,
        st.none() | st.text(max_size=3), st.none() | st.integers(-(2**15), 2**15 - 1),
    ),
    max_size=60,
)


def make_rows(rows: Sequence[tuple[Any, ...]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=ROW_SCHEMA, orient="row")


def split(frame: pl.DataFrame, cuts: Sequence[int]) -> list[pl.DataFrame]:
    """Consecutive batches at the cut points; repeated cuts make empty batches."""
    bounds = [0, *sorted(c % (frame.height + 1) for c in cuts), frame.height]
    return [frame.slice(lo, hi - lo) for lo, hi in pairwise(bounds)]


def duckdb_reference(frame: pl.DataFrame, sql: str) -> pl.DataFrame:
    with duckdb.connect() as con:
        con.register("rows", frame.with_row_index("ord").to_arrow())
        result: pl.DataFrame = con.sql(sql).pl()
    return result


def run(aggregator: PartialAggregator, batches: Sequence[pl.DataFrame]) -> pl.DataFrame:
    states = [aggregator.partial(batch.lazy()) for batch in batches]
    return aggregator.finalize(aggregator.merge(states))


def assert_same_groups(got: pl.DataFrame, expected: pl.DataFrame, by: Sequence[str]) -> None:
    # Floats: summation order differs between engines; the absolute tolerance covers
    # cancellation, where a relative error near zero means nothing.
    assert_frame_equal(
        got.sort(by, nulls_last=True), expected.sort(by, nulls_last=True),
        rel_tol=1e-9, abs_tol=1e-6,
    )


@given(rows=rows_strategy, cuts=st.lists(st.integers(0, 10**6), max_size=6))
def test_any_split_equals_one_sql_group_by(rows: list[tuple[Any, ...]], cuts: list[int]) -> None:
    frame = make_rows(rows)
    got = run(PartialAggregator(PLAN, GROUP_BY), split(frame, cuts))
    assert_same_groups(got, duckdb_reference(frame, REFERENCE_SQL), GROUP_BY)


@given(
    rows=rows_strategy,
    cuts=st.lists(st.integers(0, 10**6), max_size=8),
    rounds=st.lists(st.integers(1, 4), min_size=1, max_size=5),
)
def test_merging_in_rounds_equals_merging_once(
    rows: list[tuple[Any, ...]], cuts: list[int], rounds: list[int]
) -> None:
    aggregator = PartialAggregator(PLAN, GROUP_BY)
    states = [aggregator.partial(batch.lazy()) for batch in split(make_rows(rows), cuts)]
    once = aggregator.merge(states)
    staged = states
    for width in rounds:  # merge runs of neighbours, keeping arrival order
        staged = [aggregator.merge(staged[i:i + width]) for i in range(0, len(staged), width)]
    in_rounds = aggregator.merge(staged)
    assert in_rounds.schema == once.schema == aggregator.state_schema
    assert_same_groups(aggregator.finalize(in_rounds), aggregator.finalize(once), GROUP_BY)


# -- the same property through the decoder: messages in any key encoding --------------------

MESSAGE_SCHEMA = pa.schema([("ts", pa.int64()), ("host", pa.string()), ("region", pa.string()),
                            ("bytes_sum", pa.int64()), ("lat_min", pa.float64()),
                            ("lat_max", pa.float64())])
MESSAGE_SQL = """
SELECT ts // 10 * 10 AS window_start, host, region, CAST(SUM(bytes_sum) AS BIGINT) AS bytes_sum,
       MIN(lat_min) AS lat_min, MAX(lat_max) AS lat_max, COUNT(*) AS row_count
FROM rows GROUP BY ALL
"""
Encoding = str  # "plain", "dictionary" (first-seen order) or "shuffled" (any order, unused values)

message_rows = st.lists(
    st.tuples(st.integers(0, 199), keys, keys, st.none() | st.integers(-(2**40), 2**40),
              floats, floats),
    max_size=25,
)
messages_strategy = st.lists(
    st.tuples(message_rows, st.sampled_from(["plain", "dictionary", "shuffled"]),
              st.randoms(use_true_random=False)),
    min_size=1, max_size=8,
)


def message_key(values: list[str | None], encoding: Encoding, rng: Any) -> pa.Array:
    if encoding == "plain":
        return pa.array(values, pa.string())
    if encoding == "dictionary":
        return pa.array(values, pa.string()).dictionary_encode()
    dictionary = sorted({v for v in values if v is not None} | {"unused"})
    rng.shuffle(dictionary)
    indices = [None if v is None else dictionary.index(v) for v in values]
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()),
                                          pa.array(dictionary, pa.string()))


def encoded_message(rows: list[tuple[Any, ...]], encoding: Encoding, rng: Any) -> bytes:
    columns: list[Sequence[Any]] = ([list(c) for c in zip(*rows, strict=True)] if rows
                                    else [[] for _ in MESSAGE_SCHEMA])
    arrays = [pa.array(values, field.type) for values, field in zip(columns, MESSAGE_SCHEMA,
                                                                     strict=True)]
    arrays[1:3] = [message_key(list(columns[i]), encoding, rng) for i in (1, 2)]
    return encode_ipc_stream(pa.Table.from_arrays(arrays, names=MESSAGE_SCHEMA.names))


@given(messages=messages_strategy, poll_sizes=st.lists(st.integers(1, 4), min_size=1),
       merge_every=st.integers(1, 3))
def test_any_messages_in_any_key_encoding_equal_one_sql_group_by(
    messages: list[tuple[list[tuple[Any, ...]], Encoding, Any]], poll_sizes: list[int],
    merge_every: int,
) -> None:
    """Plain and dictionary keys mixed across messages (each message its own dictionary,
    in any order, with unused values and null keys), decoded as the daemon does, polled
    in frames of several messages into up to 20 windows, merged on any cadence."""
    decoder = Decoder(lambda s: derive_plan(s, time_column="ts", keys=["host", "region"]),
                      limits=DecodeLimits(), max_message_bytes=1 << 20)
    decoded = [decoder.decode(encoded_message(rows, enc, rng), None).table
               for rows, enc, rng in messages]
    # As the pipeline does: a message without rows feeds no window (and before the
    # first rows it does not fix the plan either).
    tables = [table for table in decoded if table.num_rows]
    assume(tables)
    assert decoder.plan is not None
    aggregator = PartialAggregator(decoder.plan, ("window_start", "host", "region"))
    store = WindowStore(aggregator, merge_every=merge_every)
    first = 0
    for size in itertools.cycle(poll_sizes):
        if first >= len(tables):
            break
        frame = poll_frame(tables[first:first + size]).lazy()
        partial = aggregator.partial(frame.with_columns(window_start=pl.col("ts") // 10 * 10))
        starts = partial.get_column("window_start").unique().to_list()
        store.add(partial, {s: s + 10 for s in starts})
        first += size
    windows = store.pop_all()
    got = pl.concat([w.frame for w in windows]) if windows else None
    rows = pl.from_arrow(pa.Table.from_pylist(
        [dict(zip(MESSAGE_SCHEMA.names, row, strict=True)) for rs, _, _ in messages for row in rs],
        schema=MESSAGE_SCHEMA))
    assert isinstance(rows, pl.DataFrame)
    expected = duckdb_reference(rows, MESSAGE_SQL)
    if got is None:
        assert expected.height == 0
        return
    got = got.drop("window_end").with_columns(pl.col("window_start").dt.epoch("ms"),
                                              pl.col("host", "region").cast(pl.String))
    assert_same_groups(got, expected, ("window_start", "host", "region"))


# -- first / last -------------------------------------------------------------------------

ORDER_PLAN = derive_plan(
    pa.schema([("k", pa.string()), ("v", pa.string()), ("w", pa.int64())]),
    keys=["k"], overrides={"v": "first", "w": "last"},
)


def test_first_and_last_follow_arrival_order_nulls_included() -> None:
    aggregator = PartialAggregator(ORDER_PLAN, ("k",))
    batches = [
        pl.DataFrame({"k": ["a", "a", "b"], "v": [None, "x", "p"], "w": [1, 2, 3]}),
        pl.DataFrame({"k": ["b", "a", "a"], "v": ["q", "y", "z"], "w": [4, 5, None]}),
        pl.DataFrame({"k": ["c"], "v": ["only"], "w": [7]}),
    ]
    expected = pl.DataFrame({
        "k": ["a", "b", "c"], "v": [None, "p", "only"], "w": [None, 4, 7],
        "row_count": [4, 2, 1],
    })
    assert_frame_equal(run(aggregator, batches).sort("k"), expected)


def python_first_last(keys: list[str], values: list[int]) -> pl.DataFrame:
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    count: dict[str, int] = {}
    for key, value in zip(keys, values, strict=True):
        first.setdefault(key, value)
        last[key] = value
        count[key] = count.get(key, 0) + 1
    return pl.DataFrame({
        "k": list(first), "v": [str(first[k]) for k in first], "w": [last[k] for k in first],
        "row_count": [count[k] for k in first],
    })


def big_frame(rows: int, groups: int) -> pl.DataFrame:
    ordinal = pl.int_range(rows, dtype=pl.Int64)
    return pl.select(
        k=(ordinal * 7919 % groups).cast(pl.String), v=ordinal.cast(pl.String), w=ordinal
    )


def test_first_and_last_in_one_large_batch() -> None:
    frame = big_frame(300_000, 1_000)
    got = run(PartialAggregator(ORDER_PLAN, ("k",)), [frame])
    expected = python_first_last(frame["k"].to_list(), frame["w"].to_list())
    assert_frame_equal(got.sort("k"), expected.sort("k"))


def test_first_and_last_through_a_streaming_merge() -> None:
    frame = big_frame(80_000, 20_000)
    aggregator = PartialAggregator(ORDER_PLAN, ("k",))
    states = [aggregator.partial(batch.lazy()) for batch in frame.iter_slices(10_000)]
    assert sum(s.height for s in states) >= _STREAMING_MERGE_FROM_ROWS  # the streaming path
    got = aggregator.finalize(aggregator.merge(states))
    expected = python_first_last(frame["k"].to_list(), frame["w"].to_list())
    assert_frame_equal(got.sort("k"), expected.sort("k"))


# -- nulls, empty batches, dtypes -----------------------------------------------------------

NULLS_PLAN = derive_plan(
    pa.schema([("k", pa.string()), ("s", pa.int64()), ("lo_min", pa.float64()),
               ("n", pa.int64()), ("m", pa.float64())]),
    overrides={"n": "count", "m": "mean"},
)


def nulls_batch(keys: list[str | None], value: int | None) -> pl.DataFrame:
    values = [value] * len(keys)
    return pl.DataFrame(
        {"k": keys, "s": values, "lo_min": values, "n": values, "m": values},
        schema={"k": pl.String, "s": pl.Int64, "lo_min": pl.Float64, "n": pl.Int64,
                "m": pl.Float64},
    )


def test_all_null_group_sums_to_null_and_counts_zero() -> None:
    aggregator = PartialAggregator(NULLS_PLAN, ("k",))
    batches = [nulls_batch(["a", "b", None], None), nulls_batch(["b", None, None], 4)]
    expected = pl.DataFrame(
        {"k": ["a", "b", None], "s": [None, 4, 8], "lo_min": [None, 4.0, 4.0], "n": [0, 1, 2],
         "m": [None, 4.0, 4.0], "row_count": [1, 2, 3]},
        schema={"k": pl.String, "s": pl.Int64, "lo_min": pl.Float64, "n": pl.Int64,
                "m": pl.Float64, "row_count": pl.Int64},
    )
    assert_frame_equal(run(aggregator, batches).sort("k", nulls_last=True), expected)


def test_empty_batch_changes_nothing() -> None:
    aggregator = PartialAggregator(NULLS_PLAN, ("k",))
    state = aggregator.partial(nulls_batch(["a", "a"], 3).lazy())
    empty = aggregator.partial(nulls_batch([], None).lazy())
    assert empty.height == 0
    assert empty.schema == state.schema == aggregator.state_schema
    assert_frame_equal(aggregator.merge([empty, state, empty]), state)
    assert_frame_equal(aggregator.finalize(empty), aggregator.finalize(state).clear())


def test_merge_of_nothing() -> None:
    aggregator = PartialAggregator(NULLS_PLAN, ("k",))
    with pytest.raises(RuntimeError, match="only after a first partial"):
        aggregator.merge([])
    aggregator.partial(nulls_batch([], None).lazy())
    assert aggregator.merge([]).schema == aggregator.state_schema


def test_result_dtypes() -> None:
    schema = pa.schema([
        ("k", pa.dictionary(pa.int32(), pa.string())), ("at", pa.timestamp("us", "UTC")),
        ("i8", pa.int8()), ("u32", pa.uint32()), ("f32", pa.float32()), ("i16_min", pa.int16()),
        ("u8_max", pa.uint8()), ("seen", pa.timestamp("ms")), ("c", pa.bool_()),
        ("avg", pa.int32()),
    ])
    plan = derive_plan(
        schema, keys=["k", "at"], overrides={"seen": "max", "c": "count", "avg": "mean"}
    )
    table = pa.table({
        "k": pa.array(["x", "x"]).dictionary_encode(), "at": pa.array([0, 0], schema[1].type),
        "i8": pa.array([100, 100], pa.int8()), "u32": pa.array([3_000_000_000] * 2, pa.uint32()),
        "f32": pa.array([0.5, 0.25], pa.float32()), "i16_min": pa.array([-3, 7], pa.int16()),
        "u8_max": pa.array([200, 9], pa.uint8()), "seen": pa.array([5, 1], pa.timestamp("ms")),
        "c": pa.array([True, None]), "avg": pa.array([1, 2], pa.int32()),
    })
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    got = run(PartialAggregator(plan, plan.keys), [frame.head(1), frame.tail(1)])
    expected = pl.DataFrame(
        {"k": ["x"], "at": [0], "i8": [200], "u32": [6_000_000_000], "f32": [0.75],
         "i16_min": [-3], "u8_max": [200], "seen": [5], "c": [1], "avg": [1.5], "row_count": [2]},
        schema={"k": pl.Categorical, "at": pl.Int64, "i8": pl.Int64, "u32": pl.UInt64,
                "f32": pl.Float64, "i16_min": pl.Int16, "u8_max": pl.UInt8, "seen": pl.Int64,
                "c": pl.Int64, "avg": pl.Float64, "row_count": pl.Int64},
    ).with_columns(
        pl.col("at").cast(pl.Datetime("us", "UTC")), pl.col("seen").cast(pl.Datetime("ms"))
    )
    assert_frame_equal(got, expected)


# -- names -------------------------------------------------------------------------------


def test_awkward_column_names_match_sql() -> None:
    schema = pa.schema([
        ('say "hi"', pa.string()), ("__s0_sum", pa.string()), ("größe_sum", pa.int64()),
        ("名前 max_max", pa.float64()), ("it's mean", pa.float64()),
    ])
    plan = derive_plan(schema, overrides={"it's mean": "mean"})
    assert plan.keys == ('say "hi"', "__s0_sum")
    frame = pl.DataFrame(
        {'say "hi"': ["a", "a", None, "a"], "__s0_sum": ["x", "x", "x", None],
         "größe_sum": [1, 2, 3, 4], "名前 max_max": [0.5, None, 2.0, 1.0],
         "it's mean": [1.0, 2.0, None, 4.0]},
        schema=polars_schema(schema),
    )
    sql = (
        'SELECT "say ""hi""", "__s0_sum", '
        'CAST(SUM("größe_sum") AS BIGINT) AS "größe_sum", '
        'MAX("名前 max_max") AS "名前 max_max", '
        "AVG(\"it's mean\") AS \"it's mean\", "
        "COUNT(*) AS row_count FROM rows GROUP BY ALL"
    )
    got = run(PartialAggregator(plan, plan.keys), [frame.head(2), frame.tail(2)])
    assert_same_groups(got, duckdb_reference(frame, sql), plan.keys)


# -- no grouping at all --------------------------------------------------------------------


def test_without_group_by_one_row_and_empty_batches_ignored() -> None:
    plan = derive_plan(pa.schema([("v", pa.int64()), ("w", pa.string())]), keys=[],
                       overrides={"w": "first"})
    aggregator = PartialAggregator(plan, ())
    frame = pl.DataFrame({"v": [1, None, 5], "w": [None, "b", "c"]})
    empty = frame.clear()
    assert aggregator.partial(empty.lazy()).height == 0
    got = run(aggregator, [empty, frame.head(1), empty, frame.tail(2)])
    sql = """SELECT CAST(SUM(v) AS BIGINT) AS v, FIRST(w ORDER BY ord) AS w,
                    COUNT(*) AS row_count FROM rows"""
    assert_frame_equal(got, duckdb_reference(frame, sql))


# -- construction ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("group_by", "message"),
    [
        (("k", "k"), r"columns \['k'\] would appear twice"),
        (("k", "s"), r"columns \['s'\] would appear twice"),
        (("k", "row_count"), r"columns \['row_count'\] would appear twice"),
        (("k", "__rows"), "clashes with the row-count state column"),
    ],
)
def test_grouping_that_would_clash(group_by: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PartialAggregator(NULLS_PLAN, group_by)


def test_keys_only_plan_counts_rows() -> None:
    plan = AggregationPlan(("k",), (), (), None)
    got = run(PartialAggregator(plan, ("k",)), [pl.DataFrame({"k": ["a", "a", "b"]})])
    assert_frame_equal(got.sort("k"), pl.DataFrame({"k": ["a", "b"], "row_count": [2, 1]}))


# -- batches of nearly distinct groups skip the partial grouping ---------------------------

ORDER_FREE_PLAN = derive_plan(
    INPUT_SCHEMA, keys=["host", "region"], overrides={"hits": "count", "avg_x": "mean"})
ORDER_FREE_SQL = """
SELECT window_start, host, region,
       CAST(SUM(bytes_sum) AS BIGINT) AS bytes_sum, MIN(lat_min) AS lat_min,
       MAX(lat_max) AS lat_max, SUM(temp) AS temp, COUNT(hits) AS hits, AVG(avg_x) AS avg_x,
       CAST(SUM(code) AS BIGINT) AS code, COUNT(*) AS row_count
FROM rows
GROUP BY window_start, host, region
"""


def distinct_batch(rows: int, seed: int) -> pl.DataFrame:
    """``rows`` rows over about ``rows`` groups (some repeated), nulls in every column."""
    pick = (pl.int_range(0, rows) * 7919 + seed) % (rows + rows // 10)
    nulls = pick % 13 == 0
    frame = pl.select(
        window_start=(pick % 2).cast(pl.Int64),
        host=pl.when(pick % 17 == 0).then(None).otherwise(pick.cast(pl.String)),
        region=pl.when(pick % 2 == 0).then(pl.lit("eu")).otherwise(pl.lit("us")),
        bytes_sum=pl.when(nulls).then(None).otherwise(pick),
        lat_min=pl.when(nulls).then(None).otherwise(pick % 1000).cast(pl.Int32),
        lat_max=(pick % 97).cast(pl.Float64),
        temp=pl.when(nulls).then(None).otherwise(pick * 0.5),
        hits=pl.when(nulls).then(None).otherwise(pick),
        avg_x=pick.cast(pl.Float64) / 4,
        label=pl.lit("x"),
        code=pl.when(nulls).then(None).otherwise(pick % 100).cast(pl.Int16),
    )
    return frame.select(ROW_SCHEMA.names()).cast(ROW_SCHEMA)


def test_batches_of_distinct_groups_give_the_sql_result() -> None:
    aggregator = PartialAggregator(ORDER_FREE_PLAN, GROUP_BY)
    batches = [distinct_batch(60_000, seed) for seed in range(4)]
    states = [aggregator.partial(batch.lazy()) for batch in batches]
    assert states[1].height == batches[1].height  # after the probe, rows pass ungrouped
    assert {s.schema == aggregator.state_schema for s in states} == {True}
    got = aggregator.finalize(aggregator.merge(states))
    reference = duckdb_reference(pl.concat(batches), ORDER_FREE_SQL)
    assert_same_groups(got, reference, GROUP_BY)


# -- dictionary-encoded input (arrowagg's own workers) --------------------------------------

DICT_PLAN = derive_plan(pa.schema([("site", pa.string()), ("sensor", pa.string()),
                                   ("v_sum", pa.float64()), ("v_max", pa.int64())]))
DICT_GROUP_BY = ("window_start", "site", "sensor")
DICT_SQL = """
SELECT window_start, site, sensor, SUM(v_sum) AS v_sum, MAX(v_max) AS v_max,
       COUNT(*) AS row_count
FROM rows GROUP BY ALL
"""


def message_table(index: int, rows: int) -> pa.Table:
    """One message: its own key values, some shared with other messages, some null."""
    sites = [None if (i + index) % 11 == 0 else f"s{(i * 7 + index * 3) % 23}"
             for i in range(rows)]
    return pa.table({
        "window_start": pa.array([(i + index) % 3 * 1_000 for i in range(rows)], pa.int64()),
        "site": pa.array(sites),
        "sensor": pa.array([f"n{(i + index) % 4}" for i in range(rows)]),
        "v_sum": pa.array([None if i % 5 == 0 else i * 0.25 for i in range(rows)]),
        "v_max": pa.array([i * index % 17 for i in range(rows)], pa.int64()),
    })


@pytest.mark.parametrize("encoding", ["plain", "dictionary"])
def test_messages_with_their_own_dictionaries_aggregate_like_sql(encoding: str) -> None:
    plain = [message_table(i, 40 + i) for i in range(6)]
    # dictionary_encode gives each message its own dictionary, in first-seen order.
    sent = [dictionary_keys(t) for t in plain] if encoding == "dictionary" else plain
    aggregator = PartialAggregator(DICT_PLAN, DICT_GROUP_BY)
    polls = [poll_frame(sent[:2]), poll_frame(sent[2:3]), poll_frame(sent[3:])]
    got = run(aggregator, polls).with_columns(pl.col("site", "sensor").cast(pl.String))
    frame = pl.from_arrow(pa.concat_tables(plain))
    assert isinstance(frame, pl.DataFrame)
    assert_same_groups(got, duckdb_reference(frame, DICT_SQL), DICT_GROUP_BY)


def test_a_million_distinct_dictionary_keys_aggregate_like_sql() -> None:
    """The high-cardinality path (batches pass ungrouped, one merge groups them) with
    dictionary keys: every row its own group, plus some repeats across batches."""
    groups, rows = 1_000_000, 250_000
    batches = []
    for b in range(5):
        pick = (pl.int_range(0, rows, dtype=pl.Int64, eager=True) + b * 190_000) % groups
        table = pl.select(
            window_start=pl.lit(0, pl.Int64), site=pl.format("site-{}", pick // 8),
            sensor=pl.format("sensor-{}", pick % 8), v_sum=pick.cast(pl.Float64) / 2,
            v_max=pick % 1_000,
        ).to_arrow()
        batches.append(poll_frame([dictionary_keys(table)]))
    aggregator = PartialAggregator(DICT_PLAN, DICT_GROUP_BY)
    states = [aggregator.partial(batch.lazy()) for batch in batches]
    assert states[1].height == rows  # ungrouped after the probe
    got = aggregator.finalize(aggregator.merge(states, regroup=True))
    plain = pl.concat(batches).with_columns(pl.col("site", "sensor").cast(pl.String))
    expected = duckdb_reference(plain, DICT_SQL)
    assert got.height == expected.height
    assert_same_groups(got.with_columns(pl.col("site", "sensor").cast(pl.String)), expected,
                       DICT_GROUP_BY)
