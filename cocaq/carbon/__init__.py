"""Grid carbon intensity: the default per zone from codecarbon's data (zones.py), and hourly series
imported from Electricity Maps exports or plain CSV, averaged over each job's hours (intensity.py)."""
