"""Reference oracles (issue 24): a package, so these modules do not clash with tests/test_<method>.py."""
