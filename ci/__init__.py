"""Repository tooling for the performance CI, run as `python -m ci <command>`: perf (the main job), gate,
calibrate, record, report, bisect, publish. All logic lives here so the workflow YAML stays thin and the same
commands run on a laptop."""
