//! Reading the small files a user names (a pipeline, a token file, TLS keys): regular files
//! only, and no more than a limit, so that `/dev/zero` or a FIFO given by mistake is a
//! one-line error rather than a process that reads until it runs out of memory.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Opens `path` for reading if it is a regular file. A FIFO would block the open until a
/// writer came (and a device could be endless), and a path checked before it is opened can
/// be swapped for one meanwhile: it is opened without blocking (`O_NONBLOCK`, which reads
/// of a regular file ignore), then what was opened is checked.
pub fn open_regular(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    check_regular(&file)?;
    Ok(file)
}

/// Fails unless `file` (opened already, perhaps for writing too) is a regular file: a
/// FIFO's reads would block forever, and a device's be endless or empty.
pub fn check_regular(file: &File) -> io::Result<()> {
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "is not a regular file (a FIFO, device, socket or folder)",
        ));
    }
    Ok(())
}

/// Reads `path`, a regular file of at most `max` bytes.
pub fn read_small_file(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let file = open_regular(path)?;
    let len = file.metadata()?.len();
    let too_big = |len: u64| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("is {len} bytes; at most {max} are read"),
        )
    };
    if len > max {
        return Err(too_big(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Reads `path`, a regular file of at most `max` bytes of UTF-8 text.
pub fn read_small_text(path: &Path, max: u64) -> io::Result<String> {
    String::from_utf8(read_small_file(path, max)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "is not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_small_regular_files_are_read() {
        let dir = std::env::temp_dir().join(format!("hydrant-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("a.toml");
        std::fs::write(&file, "name = \"x\"\n").unwrap();
        assert_eq!(read_small_text(&file, 100).unwrap(), "name = \"x\"\n");
        let err = read_small_text(&file, 4).unwrap_err().to_string();
        assert!(err.contains("at most 4"), "{err}");
        let err = read_small_text(&dir, 100).unwrap_err().to_string();
        assert!(err.contains("regular file"), "{err}");
        #[cfg(unix)]
        {
            let err = read_small_text(Path::new("/dev/zero"), 100).unwrap_err();
            assert!(err.to_string().contains("regular file"), "{err}");
        }
        std::fs::write(&file, [0xff, 0xfe]).unwrap();
        assert!(read_small_text(&file, 100).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
