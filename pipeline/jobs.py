"""Jobs: everything for one device, and the re-calibration subset the schedule runs."""
import dagster as dg


characterize_device = dg.define_asset_job(
    "characterize_device", selection=dg.AssetSelection.all(),
    description="Measure, fit, predict and report for one device partition.")

# Samples and models only: drift in drivers or clocks shows up as new model versions;
# the predictions downstream follow through their eager automation condition.
recalibrate = dg.define_asset_job(
    "recalibrate", selection=dg.AssetSelection.groups("characterize", "fit"),
    description="Re-measure the sample tables and re-fit the models of a device.")
