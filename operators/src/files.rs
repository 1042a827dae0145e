//! Reading the small files a user names (a pipeline, a token file, TLS keys): regular files
//! only, and no more than a limit, so that `/dev/zero` or a FIFO given by mistake is a
//! one-line error rather than a process that reads until it runs out of memory.

use std::io::{self, Read};
use std::path::Path;

/// Reads `path`, a regular file of at most `max` bytes.
pub fn read_small_file(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(invalid(
            "is not a regular file (a FIFO, device or folder)".into(),
        ));
    }
    let too_big = |len: u64| invalid(format!("is {len} bytes; at most {max} are read"));
    if meta.len() > max {
        return Err(too_big(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    std::fs::File::open(path)?
        .take(max + 1)
        .read_to_end(&mut bytes)?;
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
