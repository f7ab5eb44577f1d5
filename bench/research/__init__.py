"""The research instruments: experiments behind the findings, apart from ``make bench``.

They take the product apart to say where its time and memory go, and some do so by
patching its internals for the run (``PartialAggregator``'s methods, ``wire.input``'s
checks), which the user-facing benchmark (``bench``) never does. Each has a ``main``, run by
``python -m bench.research NAME [--smoke]``; their tests run in ``make research``.

- ``floor``: the Polars floor taken apart beside DataFusion (grouping alone, integer
  keys, the output alone, arrowagg with its input checks switched off);
- ``stage_times``: arrowagg's kernel run and the floor's, timed stage by stage;
- ``memory_floor``: live memory stage by stage, with freed pages handed back at once;
- ``purge``: memory and kernel time with a purge of Polars' jemalloc after each merge;
- ``jemalloc``: Polars' own jemalloc's ``mallctl``, reached for ``purge``;
- ``sessions``: session windows against tumbling windows through the daemon's pipeline;
- ``scale_out_cost``: the scale-out's price split into a fixed cost per run and a cost
  per row, through the real broker;
- ``cases``: what their command lines share (``--smoke``, the kernel's payloads).
"""
