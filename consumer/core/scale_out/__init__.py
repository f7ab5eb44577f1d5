"""The two-stage scale-out: stage 1 per input partition, stage 2 per repartition
partition; every instance runs both (docs/design.md, "Scale-out: two stages").

- ``key_hash``: the stable hash that sends a group's partial states to one partition;
- ``stage_one``: ``PartialEmitter``, closed windows as partial states and progress records;
- ``stage_two``: ``StageTwo``, partial states merged and emitted once every input
  partition's frontier is past the window;
- ``merge``: the merging of one window's partial states from many writers;
- ``kept``: emitted windows kept for revisions (``window.late: revise``);
- ``pipeline``: ``TwoStagePipeline``, both stages behind the run loop's interface.
"""
