"""Every figure of the study, as SVG with editable text and PNG.

- ``registry``: every figure kind declared once (``FIGURES``: what each is drawn for,
  the tables it reads, the options it draws with); the workflow, ``sinkscope.plot`` and
  the CLI derive from it. No imports, so the Snakefile reads it while parsing.
- the shared drawing code, one concern a module: ``style`` (style, option defaults,
  saving), ``text`` (the words figures print), ``views`` (the data a figure draws),
  ``layout`` (the page, panels, ticks), ``colours`` (palette, colour scales, heat maps),
  ``marks`` (axis marks, legend handles).
- one module per kind (``sinkscope.figures.figure4`` draws ``figure4``), each importing
  only the shared drawing modules, ``sinkscope.stats.summaries``, ``sinkscope.tables``
  and ``sinkscope.naming``.
- ``render``: reading a figure's inputs and drawing it (``draw``, ``figure_job``; several in
  one process: ``figures_job``).
- ``report``: the summary page.

May import ``tables``, ``stats.summaries`` and the base modules; never torch.
"""

__all__ = [
    "DEFAULTS",
    "KINDS",
    "draw",
    "figure_job",
    "figures_job",
    "module",
    "read_token_profiles",
    "save_figure",
]


def __getattr__(name: str):
    # The drawing side loads matplotlib: only on first use, so that the Snakefile can
    # read the registry cheaply. An explicit import keeps the code digest's scan complete.
    if name in __all__:
        from sinkscope.figures import render

        return getattr(render, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
