"""The measurement core's runners: `kinv bench`, `kinv regress`, screening, the campaign's executor,
placement, premise checks, the search space, resources."""
