//! A bounded, closable queue between the client's background thread and
//! the user: deliveries of one subscription, or the client's events. It is
//! bounded in items and in bytes; when a new item does not fit, the oldest
//! ones are dropped and counted, so the background thread never blocks on
//! a reader that has stopped reading.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Why nothing was received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Empty {
    /// The deadline passed.
    Timeout,
    /// The queue is closed and drained.
    Closed,
}

#[derive(Debug)]
struct Queue<T> {
    /// Each item with the bytes it counts for.
    items: VecDeque<(T, usize)>,
    bytes: usize,
    dropped: u64,
    closed: bool,
}

#[derive(Debug)]
pub(crate) struct Inbox<T> {
    queue: Mutex<Queue<T>>,
    ready: Condvar,
    capacity: usize,
    bytes_max: usize,
}

impl<T> Inbox<T> {
    /// A queue holding at most `capacity` items (at least one) and at most
    /// `bytes_max` bytes, except that the newest item always fits.
    pub(crate) fn new(capacity: usize, bytes_max: usize) -> Self {
        Inbox {
            queue: Mutex::new(Queue {
                items: VecDeque::new(),
                bytes: 0,
                dropped: 0,
                closed: false,
            }),
            ready: Condvar::new(),
            capacity: capacity.max(1),
            bytes_max,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue<T>> {
        // The queue stays consistent even if a holder panicked.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends `item`, which counts for `bytes`, dropping the oldest items
    /// until it fits. Items pushed after [`Inbox::close`] are discarded.
    pub(crate) fn push(&self, item: T, bytes: usize) {
        let mut queue = self.lock();
        if queue.closed {
            return;
        }
        while queue.items.len() >= self.capacity
            || (!queue.items.is_empty() && queue.bytes.saturating_add(bytes) > self.bytes_max)
        {
            if let Some((_, old)) = queue.items.pop_front() {
                queue.bytes -= old;
                queue.dropped = queue.dropped.saturating_add(1);
            }
        }
        queue.bytes = queue.bytes.saturating_add(bytes);
        queue.items.push_back((item, bytes));
        drop(queue);
        self.ready.notify_one();
    }

    fn pop(queue: &mut Queue<T>) -> Option<T> {
        let (item, bytes) = queue.items.pop_front()?;
        queue.bytes -= bytes;
        Some(item)
    }

    /// No more items will come; receivers drain what is left, then see
    /// [`Empty::Closed`].
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    /// The next item, waiting until `deadline` (forever with `None`).
    pub(crate) fn recv(&self, deadline: Option<Instant>) -> Result<T, Empty> {
        let mut queue = self.lock();
        loop {
            if let Some(item) = Self::pop(&mut queue) {
                return Ok(item);
            }
            if queue.closed {
                return Err(Empty::Closed);
            }
            queue = match deadline {
                None => self.ready.wait(queue).unwrap_or_else(|p| p.into_inner()),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(Empty::Timeout);
                    }
                    match self.ready.wait_timeout(queue, left) {
                        Ok((guard, _)) => guard,
                        Err(p) => p.into_inner().0,
                    }
                }
            };
        }
    }

    /// An item if one is queued.
    pub(crate) fn try_recv(&self) -> Result<Option<T>, Empty> {
        let mut queue = self.lock();
        match Self::pop(&mut queue) {
            Some(item) => Ok(Some(item)),
            None if queue.closed => Err(Empty::Closed),
            None => Ok(None),
        }
    }

    /// Items dropped because the queue was full.
    pub(crate) fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Items waiting to be received.
    pub(crate) fn len(&self) -> usize {
        self.lock().items.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;
    use std::time::Duration;

    #[test]
    fn full_queue_drops_the_oldest_and_counts() {
        let inbox = Inbox::new(3, usize::MAX);
        for n in 0..5 {
            inbox.push(n, 1);
        }
        assert_eq!(inbox.len(), 3);
        assert_eq!(inbox.dropped(), 2);
        let got: Vec<_> = (0..3).map(|_| inbox.try_recv().unwrap().unwrap()).collect();
        assert_eq!(got, vec![2, 3, 4]);
        assert_eq!(inbox.try_recv(), Ok(None));
    }

    #[test]
    fn the_byte_bound_drops_the_oldest_until_the_new_item_fits() {
        let inbox = Inbox::new(100, 10);
        inbox.push('a', 4);
        inbox.push('b', 4);
        inbox.push('c', 4);
        assert_eq!((inbox.len(), inbox.dropped()), (2, 1));
        // An item larger than the bound still gets in, alone.
        inbox.push('d', 50);
        assert_eq!((inbox.len(), inbox.dropped()), (1, 3));
        assert_eq!(inbox.try_recv(), Ok(Some('d')));
        inbox.push('e', 10);
        inbox.push('f', 0);
        assert_eq!(inbox.len(), 2, "the bytes of received items are released");
    }

    #[test]
    fn closing_drains_then_reports_closed() {
        let inbox = Inbox::new(0, 0);
        inbox.push("a", 10);
        inbox.close();
        inbox.push("late", 0);
        assert_eq!(inbox.recv(None), Ok("a"));
        assert_eq!(inbox.recv(None), Err(Empty::Closed));
        assert_eq!(inbox.try_recv(), Err(Empty::Closed));
    }

    #[test]
    fn recv_times_out_and_wakes_on_push() {
        let inbox = Arc::new(Inbox::new(4, usize::MAX));
        let soon = Instant::now() + Duration::from_millis(20);
        assert_eq!(inbox.recv(Some(soon)), Err(Empty::Timeout));
        let pusher = Arc::clone(&inbox);
        let handle = thread::spawn(move || pusher.push(9, 0));
        let later = Instant::now() + Duration::from_secs(10);
        assert_eq!(inbox.recv(Some(later)), Ok(9));
        handle.join().unwrap();
    }
}
