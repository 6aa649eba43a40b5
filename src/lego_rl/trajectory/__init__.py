"""Turn records → segments → training Samples.

Modules: ``records`` (the adapter's TurnRecord contract), ``manager`` (TrajectoryManager, build_samples),
``sample`` (Sample, save_samples/load_samples), ``export`` (samples_from_turn_records_file).
Nothing is imported here, so the adapter can import ``records`` without pulling in pyarrow.
"""
