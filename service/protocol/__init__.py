"""Between the outrig.v1 protocol and the engine, without gRPC: `codec` checks a request's
messages and turns them into engine objects (and stored entries back into messages), `wire` frames
entries' encodings as replies and reads a message's tags without decoding it."""
