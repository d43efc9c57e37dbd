"""The text layer: what turns an engine's text (or token ids) into an answer, sans-io."""
