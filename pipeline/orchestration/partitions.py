"""One partition per characterized device; keys are device slugs (see pipeline/device/discover.py)."""
import dagster as dg

devices = dg.DynamicPartitionsDefinition(name="devices")
