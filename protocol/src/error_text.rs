//! An error and its causes as one line of text: what an `Error` frame
//! carries across the boundary, and what hull and its agents print. One
//! copy for both sides of the wire.

use std::error::Error;

/// `a: b: c` from `e` and its sources, each cause once: a cause whose text
/// the message already holds (an error that prints its source) is skipped.
pub fn error_chain(e: &dyn Error) -> String {
    error_chain_with(e, ": ")
}

/// [`error_chain`] with the causes joined by `sep`.
pub fn error_chain_with(e: &dyn Error, sep: &str) -> String {
    let mut msg = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !msg.contains(&text) {
            msg.push_str(sep);
            msg.push_str(&text);
        }
        cause = c.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Says(#[source] std::io::Error);

    #[test]
    fn each_cause_is_printed_once() {
        let io = || std::io::Error::other("inner");
        assert_eq!(error_chain(&Outer(io())), "outer: inner");
        assert_eq!(error_chain(&Says(io())), "outer: inner");
        assert_eq!(
            error_chain_with(&Outer(io()), "\n  caused by: "),
            "outer\n  caused by: inner"
        );
    }
}
