"""Arrow types as the plan's rules see them (consumer/core/plan.py): numeric (summed by
default; sum, mean, median and quantile take nothing else; decimals are summed, and
compared by min and max, exactly), strings (dictionary-encoded ones too), orderable
(what min and max take), and group keys by default (strings and timestamps).
"""

from __future__ import annotations

import pyarrow as pa


def is_numeric(dtype: pa.DataType) -> bool:
    """Integers, floats and decimal128 (what databases and Parquet files hold money in)."""
    return bool(pa.types.is_integer(dtype) or pa.types.is_floating(dtype)
                or pa.types.is_decimal128(dtype))


def is_string(dtype: pa.DataType) -> bool:
    """utf8, large_utf8, string_view, or a dictionary whose values are any of these."""
    if pa.types.is_dictionary(dtype):
        return is_string(dtype.value_type)
    return bool(
        pa.types.is_string(dtype)
        or pa.types.is_large_string(dtype)
        or pa.types.is_string_view(dtype)
    )


def is_orderable(dtype: pa.DataType) -> bool:
    temporal = (
        pa.types.is_timestamp(dtype) or pa.types.is_date(dtype)
        or pa.types.is_time(dtype) or pa.types.is_duration(dtype)
    )
    return bool(is_numeric(dtype) or is_string(dtype) or temporal)


def is_default_key(dtype: pa.DataType) -> bool:
    return bool(is_string(dtype) or pa.types.is_timestamp(dtype))


def key_kind(dtype: pa.DataType) -> str:
    """What a default key is, in the words of the rules: a string or a timestamp."""
    return "string" if is_string(dtype) else "timestamp"
