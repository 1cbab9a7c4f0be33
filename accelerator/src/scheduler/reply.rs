//! Where a request's answer goes.

use hunch_core::{ReadError, ReadOutcome};

/// Where a request's answer goes, and whether anyone still waits for it.
pub struct Reply {
    send: Box<dyn FnOnce(Result<ReadOutcome, ReadError>) + Send>,
    abandoned: Box<dyn Fn() -> bool + Send>,
}

impl Reply {
    /// An answer handed to `send`; never abandoned.
    pub fn new(send: impl FnOnce(Result<ReadOutcome, ReadError>) + Send + 'static) -> Self {
        Reply {
            send: Box::new(send),
            abandoned: Box::new(|| false),
        }
    }

    /// `abandoned` says when the client has gone away (its connection closed, its timeout
    /// passed): the scheduler then drops the request's remaining work instead of spending
    /// forward passes on an answer nobody reads.
    pub fn with_abandoned(mut self, abandoned: impl Fn() -> bool + Send + 'static) -> Self {
        self.abandoned = Box::new(abandoned);
        self
    }

    pub fn send(self, outcome: Result<ReadOutcome, ReadError>) {
        (self.send)(outcome)
    }

    pub fn is_abandoned(&self) -> bool {
        (self.abandoned)()
    }
}
