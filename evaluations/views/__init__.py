"""Dashboard views, one module per area: projects (home, overview, members), specs, runs,
executions, review. Function views; a page renders `page.html#region` for htmx requests."""
