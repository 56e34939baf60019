"""The ledger's migration scripts, one per schema change, in revision order."""
