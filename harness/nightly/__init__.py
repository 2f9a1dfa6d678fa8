"""Nightly regression history: one record per night, a gate against recent nights, change points
over the whole history, reports and a static dashboard. See docs/nightly.md."""
