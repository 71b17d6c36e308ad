//! The bytes a tar stream decompresses to, bounded as they are read, whatever its headers
//! claim. The tar reader keeps a GNU long name, a long link name or a PAX record whole in
//! memory before it hands over the entry they describe, and skips the data of an entry that is
//! not read: neither is a file's data that the unpacker counts. So the stream is read through
//! a [`BudgetedReader`] that counts every byte against a [`ReadBudget`]: all the stream
//! together at most the files' bound plus a small allowance per entry for the headers, and
//! what is read between one entry's data and the next (the skipped rest of an entry, the
//! extension records, the headers) at most [`BETWEEN_ENTRIES`]. Past either the read fails,
//! and the unpack answers [`InstallError::TooLarge`].

use std::cell::Cell;
use std::io::{self, Read};
use std::rc::Rc;

use crate::install::error::InstallError;

/// What a tar stream may hold between the data of two entries: the headers, the extension
/// records of the next entry (a long name, a long link name, PAX records) and what is left
/// of the entry before (at most [`MAX_NON_FILE_DATA`] when it is not a file, whose data is
/// read whole).
pub const BETWEEN_ENTRIES: u64 = 4 * MAX_NON_FILE_DATA + (8 << 10);

/// The most data an entry that is not a file (a folder, a link, a global header) may carry.
pub const MAX_NON_FILE_DATA: u64 = 64 << 10;

/// What each entry adds to the stream's bound beyond the files' bytes: its header, its
/// padding and its extension records, as an archive with long names has them.
const PER_ENTRY: u64 = 4 << 10;

/// How much of a tar stream is left to read; shared by the reader and the unpacker, which
/// says when an entry's data is being read.
#[derive(Debug)]
pub struct ReadBudget {
    /// Read so far, all the stream.
    read: Cell<u64>,
    /// The most the stream may decompress to.
    max_total: u64,
    /// What is left to read before the next entry's data; None while an entry's data is read.
    between: Cell<Option<u64>>,
    /// Why a read was refused, once one was.
    refused: Cell<Option<&'static str>>,
}

impl ReadBudget {
    /// The budget of a stream whose files hold at most `max_bytes` in at most `max_entries`
    /// entries.
    pub fn new(max_bytes: u64, max_entries: usize) -> Self {
        let allowance = (max_entries as u64)
            .saturating_add(1)
            .saturating_mul(PER_ENTRY);
        Self {
            read: Cell::new(0),
            max_total: max_bytes.saturating_add(allowance),
            between: Cell::new(Some(BETWEEN_ENTRIES)),
            refused: Cell::new(None),
        }
    }

    /// From now on the reads are headers and extension records, until [`Self::in_entry`].
    pub fn between_entries(&self) {
        self.between.set(Some(BETWEEN_ENTRIES));
    }

    /// From now on the reads are an entry's data (counted by the unpacker as written).
    pub fn in_entry(&self) {
        self.between.set(None);
    }

    /// Counts `n` bytes read; an error once a bound is passed.
    fn take(&self, n: u64) -> io::Result<()> {
        let read = self.read.get().saturating_add(n);
        self.read.set(read);
        if read > self.max_total {
            return Err(self.refuse("the archive decompresses to more than its bounds allow"));
        }
        if let Some(left) = self.between.get() {
            match left.checked_sub(n) {
                Some(left) => self.between.set(Some(left)),
                None => {
                    return Err(self.refuse(
                        "the archive holds more than 256 KiB of headers and extension records \
                         (long names, PAX records) between two entries",
                    ));
                }
            }
        }
        Ok(())
    }

    fn refuse(&self, why: &'static str) -> io::Error {
        self.refused.set(Some(why));
        io::Error::other(why)
    }

    /// `error` as the unpack's answer: [`InstallError::TooLarge`] when the budget refused a
    /// read (whatever the reader made of that failure), else `error` itself.
    pub fn explain(&self, error: InstallError) -> InstallError {
        match self.refused.get() {
            Some(why) => InstallError::TooLarge(why.to_owned()),
            None => error,
        }
    }
}

/// A reader whose bytes are counted against a [`ReadBudget`].
#[derive(Debug)]
pub struct BudgetedReader<R> {
    inner: R,
    budget: Rc<ReadBudget>,
}

impl<R> BudgetedReader<R> {
    /// `inner`, counted against `budget`.
    pub fn new(inner: R, budget: Rc<ReadBudget>) -> Self {
        Self { inner, budget }
    }
}

impl<R: Read> Read for BudgetedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.budget.take(n as u64)?;
        Ok(n)
    }
}
