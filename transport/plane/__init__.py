"""The event plane: event records, the publisher, subscriber, relay and snapshot broker."""
