"""``python -m repro.report results/<study>``: build the study's ``REPORT.md``."""

from repro.report.build import main

raise SystemExit(main())
