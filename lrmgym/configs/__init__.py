"""Run configuration: YAML presets, the pydantic schema, and the resolver for ``GROUP=PRESET`` overrides."""
