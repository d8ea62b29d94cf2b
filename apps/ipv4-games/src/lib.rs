//! The IPv4 Games (being written).
