"""The pipeline: from a config to jobs, and the jobs themselves.

- ``config``: the config file read, coerced, defaulted and checked (``load_study``).
- ``study``: the planned study (``Study``), composed of the stage planners ``grid``
  (sources, runs, layer groups), ``extractplan``, ``effectsplan``, ``figureplan`` and
  ``videoplan``; ``layout``: the file tree under a study's results folder (the patterns
  the rules write); ``studystamp``: which study a results folder holds.
- ``resources``: devices, memory estimates, GPU slots.
- ``codedigest``: digests of the code each stage runs, for Snakemake's rerun triggers.
- ``invocation``: how Snakemake was invoked (run, dry run, inspection; executor).
- ``integrity``: manifests, the pre-run scan and quarantine of damaged results.
- ``jobs``: what every job shares (log, one-line errors, device, provenance).
- ``extract`` and ``aggregate``: the extraction and aggregation jobs.

The top layer of the package: it may import every other subpackage. The planning
modules (config, study and its planners, layout, studystamp, resources, codedigest,
invocation, integrity) import no torch, so that the Snakefile parses fast; only the job
modules load the model.
"""
