"""``python -m sinkscope.train``: train the demo model (``sinkscope.demo.train``)."""

from sinkscope.demo.train import main

if __name__ == "__main__":
    raise SystemExit(main())
