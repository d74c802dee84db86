//! The wire contract between hull and its guest agent. (in progress)
