"""The process and the files under it: the allocator tuned for long runs, shipped data located, YAML read as
untrusted input.  Imports only the domain."""
