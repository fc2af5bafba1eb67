//! Pure protocol codecs.
