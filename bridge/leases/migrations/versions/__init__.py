"""The bridge's migration scripts, one per schema change, in revision order."""
