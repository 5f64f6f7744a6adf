"""Intake: the HTTP server, request handling and body parsing, back-pressure, and the status document it serves."""
