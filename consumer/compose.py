"""The composition root: the settings become a pipeline, and a processor with its Kafka
clients. The daemon's command line and the benchmarks build through here, so both run
the same objects."""

from __future__ import annotations

import polars as pl
from confluent_kafka import Consumer

from consumer.config import Settings, pinned_origin, pinned_schema, plan_for
from consumer.core.budget import GroupBudget
from consumer.core.decode import Decoder
from consumer.core.dlq import DlqLimit
from consumer.core.emit import OutputSpec
from consumer.core.pipeline import Pipeline
from consumer.core.plan import AggregationPlan
from consumer.core.poll import PollPipeline
from consumer.core.scale_out.pipeline import TwoStagePipeline
from consumer.core.scale_out.session_runs import SessionRunsEngine
from consumer.core.scale_out.stage_one import PartialEmitter
from consumer.core.scale_out.stage_two import StageTwo
from consumer.core.types import PartitionKey
from consumer.core.windows.bounds import WindowSpec
from consumer.core.windows.count.engine import CountWindowEngine
from consumer.core.windows.engine import WindowEngine
from consumer.core.windows.session.engine import SessionWindowEngine
from consumer.core.windows.session.spans import SessionSpec
from consumer.core.windows.time.engine import TimeWindowEngine
from consumer.kafka.clients import (
    consumer_config,
    ensure_repartition_topic,
    instance_id,
    producer_config,
    topic_partitions,
)
from consumer.kafka.processor import StreamProcessor
from consumer.kafka.sink import AtLeastOnceSink, OutputSink, TransactionalSink
from consumer.service.observer import NullObserver, ProcessorObserver
from wire.input import DecodeLimits


def build_pipeline(settings: Settings) -> Pipeline:
    """The per-poll pipeline the settings describe (one instance, or stage 1 of the
    scale-out: see build_two_stages)."""
    inputs, output, limit = settings.input, settings.output, settings.dlq_limit
    decoder = Decoder(
        lambda schema: plan_for(settings, schema),
        limits=DecodeLimits(max_rows=inputs.max_rows_per_message,
                            max_decoded_bytes=inputs.max_decoded_bytes_per_message),
        max_message_bytes=inputs.max_message_bytes,
    )
    if (schema := pinned_schema(settings.aggregation)) is not None:
        decoder.pin(schema, pinned_origin(settings.aggregation))
    routes = OutputSpec(output.topic, settings.kafka.group_id, late_topic=output.late_topic,
                    dlq_topic=output.dlq_topic, output_format=output.format,
                    compression=output.compression, max_message_bytes=output.max_message_bytes,
                    drop_late=settings.window.late == "drop",
                    revision_column=settings.window.late == "revise",
                    sessions=settings.window.kind == "session",
                    provisional=settings.window.emit_every_ms is not None)
    scale_out = settings.scale_out
    emitter = None if scale_out is None else PartialEmitter(
        scale_out.repartition_topic, scale_out.partitions,
        writer=instance_id(settings.processing), compression=scale_out.compression,
        max_message_bytes=output.max_message_bytes)
    return Pipeline(
        decoder, lambda plan, time_dtype: build_engine(settings, plan, time_dtype), routes,
        emitter=emitter, idle_timeout_ms=settings.window.idle_timeout_ms,
        dlq_limit=DlqLimit(max_invalid_ratio=limit.max_invalid_ratio,
                           window_messages=limit.window_messages,
                           max_consecutive_invalid=limit.max_consecutive_invalid),
        budget=GroupBudget(inputs.max_groups, inputs.over_budget,
                           max_values=inputs.max_buffered_values),
        commit_interval_ms=settings.processing.commit_interval_ms,
        # Count windows number their windows: their frontier is no time to bound.
        max_future_ms=None if settings.window.kind == "count" else settings.window.max_future_ms,
        emit_every_ms=settings.window.emit_every_ms,
    )


def build_two_stages(settings: Settings, inputs: set[PartitionKey]) -> TwoStagePipeline:
    """Both stages of the scale-out; ``inputs``: the input partitions there are now."""
    assert settings.scale_out is not None  # noqa: S101 - called only with a scale_out section
    stage_one = build_pipeline(settings)
    output = settings.output
    routes = OutputSpec(output.topic, settings.kafka.group_id, late_topic=output.late_topic,
                    output_format=output.format, compression=output.compression,
                    max_message_bytes=output.max_message_bytes,
                    drop_late=settings.window.late == "drop",
                    revision_column=settings.window.late == "revise",
                    sessions=settings.window.kind == "session")
    stage_two = StageTwo(routes, partitions=settings.scale_out.partitions, inputs=inputs,
                         merge_every=settings.processing.merge_every_batches,
                         counters=stage_one.counters,
                         budget=(settings.input.max_groups,
                                 settings.input.max_buffered_values),
                         revise_within_ms=revise_within_ms(settings),
                         emit_every_ms=settings.window.emit_every_ms,
                         sessions=session_spec(settings))
    return TwoStagePipeline(stage_one, stage_two, settings.scale_out.repartition_topic,
                            commit_interval_ms=settings.processing.commit_interval_ms)


def build_engine(settings: Settings, plan: AggregationPlan,
                 time_dtype: pl.DataType | None) -> WindowEngine:
    window, processing = settings.window, settings.processing
    if window.kind == "count":
        return CountWindowEngine(plan, batches=window.count_batches, rows=window.count_rows,
                                 idle_timeout_ms=window.idle_timeout_ms,
                                 merge_every=processing.merge_every_batches,
                                 provisional=window.emit_every_ms is not None)
    if (spec := session_spec(settings)) is not None and settings.scale_out is not None:
        return SessionRunsEngine(plan, spec, event_time=window.time == "event",
                                 time_dtype=time_dtype,
                                 allowed_lateness_ms=window.allowed_lateness_ms,
                                 idle_timeout_ms=window.idle_timeout_ms,
                                 send_every_ms=processing.commit_interval_ms,
                                 revise_within_ms=revise_within_ms(settings))
    if spec is not None:
        return SessionWindowEngine(
            plan, spec,
            event_time=window.time == "event", time_dtype=time_dtype,
            allowed_lateness_ms=window.allowed_lateness_ms,
            idle_timeout_ms=window.idle_timeout_ms,
            revise_within_ms=window.revision_lateness_ms if window.late == "revise" else None,
            provisional=window.emit_every_ms is not None)
    assert window.size_ms is not None  # noqa: S101 - checked by the config model
    return TimeWindowEngine(
        plan, WindowSpec(window.size_ms, window.step_ms or window.size_ms),
        event_time=window.time == "event", time_dtype=time_dtype,
        allowed_lateness_ms=window.allowed_lateness_ms, idle_timeout_ms=window.idle_timeout_ms,
        merge_every=processing.merge_every_batches, partials=settings.scale_out is not None,
        revise_within_ms=revise_within_ms(settings),
        provisional=window.emit_every_ms is not None and settings.scale_out is None)


def session_spec(settings: Settings) -> SessionSpec | None:
    """The sessions' gap and maximum (None: not session windows)."""
    window = settings.window
    if window.kind != "session":
        return None
    assert window.gap_ms is not None  # noqa: S101 - checked by the config model
    return SessionSpec(window.gap_ms, window.max_session_ms)


def revise_within_ms(settings: Settings) -> int | None:
    """How long emitted windows take revisions (None: they take none)."""
    window = settings.window
    return window.revision_lateness_ms if window.late == "revise" else None


def build_processor(settings: Settings, observer: ProcessorObserver | None = None, *,
                    sink: OutputSink | None = None) -> StreamProcessor:
    """The daemon: a Kafka consumer, the sink the guarantee asks for, the pipeline."""
    observer = observer or NullObserver()
    config = consumer_config(settings.kafka, settings.processing)
    if settings.service.statistics_interval_ms:
        config["statistics.interval.ms"] = settings.service.statistics_interval_ms
        config["stats_cb"] = observer.statistics
    topics = list(settings.input.topics)
    pipeline: PollPipeline
    if settings.scale_out is None:
        pipeline = build_pipeline(settings)
    else:
        ensure_repartition_topic(settings.kafka, settings.scale_out)
        pipeline = build_two_stages(settings, topic_partitions(settings.kafka, topics))
        topics.append(settings.scale_out.repartition_topic)
    return StreamProcessor(Consumer(config), sink or build_sink(settings), pipeline,
                           topics=topics, processing=settings.processing, observer=observer)


def build_sink(settings: Settings) -> OutputSink:
    config = producer_config(settings.kafka, settings.processing,
                             max_message_bytes=settings.output.max_message_bytes)
    if settings.processing.guarantee == "exactly_once":
        return TransactionalSink(config)
    return AtLeastOnceSink(config)
