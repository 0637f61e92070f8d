"""Values and text every layer reads: durations and sizes, cron expressions, glob patterns,
TOML positions, text made safe to show, secrets redacted."""
