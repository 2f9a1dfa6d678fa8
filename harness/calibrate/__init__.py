"""Calibrating the simulated engine against measurements (docs/calibration.md).

observed.py reads a measured run folder (points, scrapes, EvalScope's per-request records); table.py reads
a table of public measurements; both become targets: a simulated setup plus what was measured there.
predict.py runs one setup on the simulated engine; fit.py moves the free coefficients of a hardware
profile (coefficients.py) until the predictions meet the targets; output.py writes the calibrated
profile; validate.py simulates a whole sweep with it and compares every point with the measured run.
"""
