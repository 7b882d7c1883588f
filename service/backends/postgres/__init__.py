"""The PostgreSQL backend (issue 8, in progress): several outrig servers share one space through
one database. Not wired into `outrig serve` yet."""
