//! The peer's QPACK instruction streams when our table capacity is 0 (RFC 9204 §4.3, §4.4).

use super::MAX_INT_BYTES;

/// The peer's encoder stream: the only valid instruction is Set Dynamic Table Capacity 0
/// (`001` + 0 in a 5-bit prefix: the byte 0x20); any insert or duplicate exceeds a capacity
/// of 0 (QPACK_ENCODER_STREAM_ERROR).
#[derive(Default)]
pub struct EncoderStream;

impl EncoderStream {
    pub fn recv(&mut self, data: &[u8]) -> Result<(), &'static str> {
        if data.iter().all(|&b| b == 0x20) {
            Ok(())
        } else {
            Err("encoder stream instruction beyond a table capacity of 0")
        }
    }
}

/// The peer's decoder stream, about our encoder: we never reference the dynamic table, so a
/// Section Acknowledgment or an Insert Count Increment is a QPACK_DECODER_STREAM_ERROR; only
/// Stream Cancellations (`01` + stream id in 6 bits) are valid, and ignored.
#[derive(Default)]
pub struct DecoderStream {
    /// Continuation bytes of a Stream Cancellation's integer still to come, if inside one.
    in_integer: Option<usize>,
}

impl DecoderStream {
    pub fn recv(&mut self, data: &[u8]) -> Result<(), &'static str> {
        for &b in data {
            match self.in_integer {
                Some(n) => {
                    if n + 1 >= MAX_INT_BYTES {
                        return Err("decoder stream integer too long");
                    }
                    self.in_integer = (b & 0x80 != 0).then_some(n + 1);
                }
                None if b & 0xc0 == 0x40 => {
                    // A full 6-bit prefix means continuation bytes follow.
                    self.in_integer = (b & 0x3f == 0x3f).then_some(0);
                }
                None if b & 0x80 != 0 => {
                    return Err("Section Acknowledgment for a section without dynamic references")
                }
                None => return Err("Insert Count Increment with no entries inserted"),
            }
        }
        Ok(())
    }
}
