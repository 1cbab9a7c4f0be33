//! The requests an engine has taken and not yet read: bounded, read one at a time in the order
//! they came, a request whose caller has gone skipped. The chat and encoder engines share it.

use std::collections::VecDeque;

use hunch_core::ReadRequest;

use crate::scheduler::Reply;

pub(super) struct ReadQueue {
    waiting: VecDeque<(ReadRequest, Reply)>,
    max_requests: usize,
}

impl ReadQueue {
    /// A queue that has room for `max_requests` (at least one).
    pub(super) fn new(max_requests: usize) -> Self {
        ReadQueue {
            waiting: VecDeque::new(),
            max_requests: max_requests.max(1),
        }
    }

    pub(super) fn push(&mut self, request: ReadRequest, reply: Reply) {
        self.waiting.push_back((request, reply));
    }

    pub(super) fn has_room(&self) -> bool {
        self.waiting.len() < self.max_requests
    }

    /// The oldest request whose caller still waits, with its reply, or `None` where none is
    /// left; requests whose callers have gone are dropped unread.
    pub(super) fn next(&mut self) -> Option<(ReadRequest, Reply)> {
        while let Some((request, reply)) = self.waiting.pop_front() {
            if !reply.is_abandoned() {
                return Some((request, reply));
            }
        }
        None
    }
}
