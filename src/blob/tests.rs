//! The dealing of files to partitions and batches, and a scan's columns.

use super::*;

fn files(sizes: &[u64], batch_rows: usize) -> Files {
    Files {
        store: Arc::new(object_store::memory::InMemory::new()),
        store_url: "memory://".into(),
        metas: sizes
            .iter()
            .enumerate()
            .map(|(i, size)| ObjectMeta {
                location: format!("f{i}").into(),
                last_modified: Default::default(),
                size: *size,
                e_tag: None,
                version: None,
            })
            .collect(),
        names: (0..sizes.len()).map(|i| format!("f{i}")).collect(),
        form: Form::Blob,
        max_bytes: 1 << 30,
        batch_rows,
        ends: None,
        files_errors_fail: false,
    }
}

#[test]
fn batches_hold_a_few_files_and_bounded_bytes() {
    let mb = 1 << 20;
    let f = files(&[5 * mb, 10 * mb, 5 * mb, 200 * mb, 1, 1, 1], 3);
    assert_eq!(f.batches(0..7, true), vec![0..2, 2..3, 3..4, 4..7]);
    // Without content, only the rows count.
    assert_eq!(f.batches(0..7, false), vec![0..3, 3..6, 6..7]);
    assert_eq!(f.batches(3..3, true), Vec::<Range<usize>>::new());
}

#[tokio::test]
async fn a_file_read_at_its_ends_is_its_first_and_last_blocks() {
    let store = Arc::new(object_store::memory::InMemory::new());
    let mut f = files(&[10, 6, 0], 100);
    for (i, content) in [&b"0123456789"[..], b"abcdef", b""].into_iter().enumerate() {
        let path = object_store::path::Path::from(format!("f{i}"));
        store.put(&path, content.to_vec().into()).await.unwrap();
    }
    f.store = store;
    f.max_bytes = 6;
    f.ends = Some(3);
    assert_eq!(f.read(0).await.unwrap().as_ref(), b"012789");
    // A file of at most two blocks is read whole; the limit is on what is read, the ends of
    // a larger file too.
    f.max_bytes = 5;
    assert!(
        f.read(0)
            .await
            .is_err_and(|e| e.to_string().contains("of which 6 would be read"))
    );
    f.max_bytes = 4;
    assert!(
        f.read(1)
            .await
            .is_err_and(|e| e.to_string().contains("f1 is 6 bytes"))
    );
    f.max_bytes = 6;
    assert_eq!(f.read(1).await.unwrap().as_ref(), b"abcdef");
    assert_eq!(f.read(2).await.unwrap().as_ref(), b"");
    assert_eq!(f.batches(0..3, true), vec![0..3]);
}

/// A local file replaced by a larger one between its listing and its read is an error
/// naming it, never the new file's bytes cut to the listed size.
#[tokio::test]
async fn a_local_file_replaced_after_its_listing_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.txt");
    std::fs::write(&path, b"abcdef").unwrap();
    let store = Arc::new(object_store::local::LocalFileSystem::new());
    let location = object_store::path::Path::from_filesystem_path(&path).unwrap();
    let mut f = files(&[6], 100);
    f.metas = vec![store.head(&location).await.unwrap()];
    f.store = store;
    f.store_url = "file:///".into();
    assert_eq!(f.read(0).await.unwrap().as_ref(), b"abcdef");
    let replacement = dir.path().join("b.txt");
    std::fs::write(&replacement, vec![b'z'; 50_000]).unwrap();
    std::fs::rename(&replacement, &path).unwrap();
    let read = f.read(0).await;
    assert!(
        read.as_ref()
            .is_err_and(|e| e.to_string().contains("f0 changed while it was read")),
        "{read:?}"
    );
}

#[test]
fn partitions_take_every_file_once() {
    let f = files(&[1; 10], 100);
    let mut all = Vec::new();
    for p in 0..4 {
        all.extend(f.of_partition(p, 4));
    }
    assert_eq!(all, (0..10).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_document_removed_after_listing_is_its_own_row() {
    use datafusion::arrow::array::Array;
    let store = Arc::new(object_store::memory::InMemory::new());
    let mut f = files(&[5, 5], 100);
    store
        .put(&"f0".into(), b"hello".to_vec().into())
        .await
        .unwrap();
    // f1 is listed, and gone when it is read.
    f.store = store;
    f.form = Form::Document;
    let f = Arc::new(f);
    let schema = super::document::schema();
    let columns = Arc::new((0..schema.fields().len()).collect::<Vec<_>>());
    let batches: Vec<RecordBatch> = f
        .clone()
        .document_batches(0..2, columns, schema)
        .try_collect()
        .await
        .unwrap();
    let batch = datafusion::arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
    let text = batch
        .column(3)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    let error = batch
        .column(7)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    assert_eq!(text.value(0), "hello");
    assert!(error.is_null(0));
    assert!(text.is_null(1));
    assert!(
        error
            .value(1)
            .contains("f1 was removed after it was listed"),
        "{}",
        error.value(1)
    );
}
