//! Room: buffers that were never zeroed, filled in place: the object's bytes are written straight into the spare
//! capacity of the result (a `Vec`, later a Python `bytes`), by `pread` from a passed descriptor or
//! `read` from the socket, through raw pointers, so no reference to uninitialised memory is made and
//! no memset precedes the copy (zeroing a 16 MiB buffer costs as much as reading it from the page
//! cache).

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};

/// Uninitialised (or initialised, it makes no difference) room for bytes.
pub type Room = [MaybeUninit<u8>];

/// Where a whole-object read puts its bytes. It is asked for room once the object's size is known
/// (after the first round trip), so the destination (a `Vec`, a Python `bytes`) is allocated once,
/// at its final size, and filled in place.
pub trait Sink {
    /// Makes room for exactly `size` bytes; may be called again (a retried read) with a new size.
    fn reserve(&mut self, size: usize) -> crate::Result<()>;
    /// The reserved room; it stays at the same address until the next `reserve`.
    fn room(&mut self) -> &mut Room;
}

/// A `Vec<u8>` filled in its spare capacity; `finish` sets its length once every byte is written.
#[derive(Default)]
pub struct VecSink {
    vec: Vec<u8>,
    size: usize,
}

impl Sink for VecSink {
    fn reserve(&mut self, size: usize) -> crate::Result<()> {
        self.vec.clear();
        self.vec.reserve_exact(size);
        self.size = size;
        Ok(())
    }

    fn room(&mut self) -> &mut Room {
        &mut self.vec.spare_capacity_mut()[..self.size]
    }
}

impl VecSink {
    /// The filled vector.
    ///
    /// # Safety
    /// Every byte of the room must have been written.
    pub unsafe fn finish(mut self) -> Vec<u8> {
        // SAFETY: the caller guarantees the `size` reserved bytes were all written, and the
        // capacity is at least `size`.
        unsafe { self.vec.set_len(self.size) };
        self.vec
    }
}

/// Where [`crate::Client::read_at`] puts its bytes: initialised bytes (a reused `&mut [u8]`) or
/// [`Room`] that need not be (a buffer allocated for the read), so one read serves both.
///
/// The room view of a `[u8]` stays inside the shim, which writes only initialised bytes through it:
/// outside code holding that view could store `MaybeUninit::uninit()` into a `[u8]`, which is why
/// this is a type with a private field rather than a public `as_room`.
pub struct ReadBuf<'a>(pub(crate) &'a mut Room);

impl<'a> From<&'a mut [u8]> for ReadBuf<'a> {
    fn from(buf: &'a mut [u8]) -> ReadBuf<'a> {
        ReadBuf(as_room(buf))
    }
}

impl<'a> From<&'a mut Room> for ReadBuf<'a> {
    fn from(room: &'a mut Room) -> ReadBuf<'a> {
        ReadBuf(room)
    }
}

/// Views an initialised slice as room. Writing initialised bytes into it keeps it initialised.
pub fn as_room(buf: &mut [u8]) -> &mut Room {
    // SAFETY: `MaybeUninit<u8>` has the layout of `u8`; every write through the returned slice
    // stores initialised bytes (only the fill functions below write, and only what the kernel copied
    // in), so `buf` stays initialised.
    unsafe { &mut *(buf as *mut [u8] as *mut Room) }
}

/// The bytes of `room`, once every one of them has been filled.
///
/// # Safety
/// Every byte of `room` must have been written.
pub unsafe fn assume_filled(room: &Room) -> &[u8] {
    // SAFETY: the caller guarantees every byte was written, so the bytes are initialised `u8`s
    // with the same layout.
    unsafe { &*(room as *const Room as *const [u8]) }
}

/// Fills all of `room` from `fd` at `offset` (`pread`), continuing after short reads.
pub fn pread_exact(fd: &impl AsRawFd, room: &mut Room, offset: u64) -> io::Result<()> {
    fill_with(fd.as_raw_fd(), room, |fd, ptr, len, done| {
        let at = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset out of range"))?;
        // SAFETY: `ptr..ptr+len` lies inside `room`, which we borrow mutably; the kernel writes at
        // most `len` bytes there.
        Ok(unsafe { libc::pread(fd, ptr.cast(), len, at) })
    })
}

/// Fills `first`, then `second`, from `fd` at `offset` on: one `preadv` for both, the rest (after a
/// short read) with `pread`s. End of file first is `UnexpectedEof`.
pub fn preadv_exact(fd: RawFd, first: &mut Room, second: &mut Room, offset: u64) -> io::Result<()> {
    let at = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset out of range"))?;
    let iov = [
        libc::iovec { iov_base: first.as_mut_ptr().cast(), iov_len: first.len() },
        libc::iovec { iov_base: second.as_mut_ptr().cast(), iov_len: second.len() },
    ];
    let read = loop {
        // SAFETY: each iovec spans a room we borrow mutably for the call; the kernel writes at most
        // `iov_len` bytes into each.
        let n = unsafe { libc::preadv(fd, iov.as_ptr(), 2, at) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let file = BorrowedRaw(fd);
    if read < first.len() {
        pread_exact(&file, &mut first[read..], offset + read as u64)?;
        return pread_exact(&file, second, offset + first.len() as u64);
    }
    let done = read - first.len();
    pread_exact(&file, &mut second[done..], offset + read as u64)
}

/// A raw descriptor the caller keeps open, for the helpers that take `impl AsRawFd`.
struct BorrowedRaw(RawFd);

impl AsRawFd for BorrowedRaw {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Fills all of `room` from the stream `fd` (`read`), honouring its receive timeout.
pub fn read_exact(fd: &impl AsRawFd, room: &mut Room) -> io::Result<()> {
    // SAFETY: as in `pread_exact`: the kernel writes at most `len` bytes at `ptr`, inside `room`.
    fill_with(fd.as_raw_fd(), room, |fd, ptr, len, _| Ok(unsafe { libc::read(fd, ptr.cast(), len) }))
}

fn fill_with(
    fd: RawFd,
    room: &mut Room,
    mut op: impl FnMut(RawFd, *mut MaybeUninit<u8>, usize, usize) -> io::Result<isize>,
) -> io::Result<()> {
    let mut done = 0;
    while done < room.len() {
        let rest = &mut room[done..];
        match op(fd, rest.as_mut_ptr(), rest.len(), done)? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n if n > 0 => done += n as usize,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn preadv_fills_both_rooms_in_order_and_reports_a_short_file() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&data).unwrap();
        let (mut a, mut b) = (vec![0u8; 100], vec![0u8; 5000]);
        preadv_exact(file.as_raw_fd(), as_room(&mut a), as_room(&mut b), 7).unwrap();
        assert_eq!(a[..], data[7..107]);
        assert_eq!(b[..], data[107..5107]);
        let mut c = vec![0u8; 9950];
        let err = preadv_exact(file.as_raw_fd(), as_room(&mut a), as_room(&mut c), 7).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn fills_from_files_and_streams_and_reports_short_ones() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        let mut v: Vec<u8> = Vec::with_capacity(50_000);
        pread_exact(&f, &mut v.spare_capacity_mut()[..50_000], 25_000).unwrap();
        // SAFETY: pread_exact filled all 50_000 bytes.
        unsafe { v.set_len(50_000) };
        assert_eq!(v, data[25_000..75_000]);
        let mut room = vec![MaybeUninit::new(0u8); 10];
        let err = pread_exact(&f, &mut room, 99_995).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);

        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.write_all(b"hello").unwrap();
        let mut buf = [0u8; 5];
        read_exact(&b, as_room(&mut buf)).unwrap();
        assert_eq!(&buf, b"hello");
    }
}
