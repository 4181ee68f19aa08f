"""Report: renderers that only read a CheckResult (console, JSON/CSV via CheckResult, HTML)."""
