//! Encoding settings of an output file, taken from its input so a pass through the tool
//! does not change how the existing columns are stored: each input column keeps its
//! compression codec, and keeps dictionary encoding where the input's dictionary held for
//! the whole chunk (a writer that fell back to plain pages — typical for float columns —
//! spent its time building a dictionary it threw away; the output does not repeat that).
//! The appended columns use the mask column's codec, with a dictionary only for
//! `turn_index` (a few small integers; the float columns have too many distinct values).

use arrow::datatypes::Schema;
use parquet::arrow::ArrowSchemaConverter;
use parquet::basic::{Compression, Encoding};
use parquet::file::metadata::{ColumnChunkMetaData, ParquetMetaData};
use parquet::file::properties::WriterProperties;

use crate::schema::OUTPUT_COLUMNS;

/// Codec for outputs of inputs with no row group to copy one from.
const FALLBACK_CODEC: Compression = Compression::SNAPPY;

pub fn writer_properties(
    input: &ParquetMetaData,
    mask_column: &str,
    output_schema: &Schema,
    max_row_group_bytes: usize,
) -> Result<WriterProperties, parquet::errors::ParquetError> {
    let in_descr = input.file_metadata().schema_descr();
    let out_descr = ArrowSchemaConverter::new().convert(output_schema)?;
    let first_group = input.row_groups().first();
    let codec_of = |leaf: usize| first_group.map(|g| g.column(leaf).compression());
    let mask_leaf = (0..in_descr.num_columns())
        .find(|&i| in_descr.column(i).path().parts().first().map(String::as_str) == Some(mask_column));
    let default_codec = mask_leaf.and_then(codec_of).unwrap_or(FALLBACK_CODEC);

    let mut props = WriterProperties::builder()
        .set_compression(default_codec)
        .set_max_row_group_row_count(None)
        .set_max_row_group_bytes(Some(max_row_group_bytes.max(1)));
    // (The pipeline's encoder cuts row groups itself; the limits are set for any other
    // writer given these properties.)
    // Input fields come first in the output schema and keep their leaf order, so input
    // leaf i is output leaf i (paths may differ: list children are renamed on the way).
    for leaf in 0..out_descr.num_columns() {
        let path = out_descr.column(leaf).path().clone();
        if leaf < in_descr.num_columns() {
            if let Some(g) = first_group {
                let chunk = g.column(leaf);
                let dictionary = dictionary_held(chunk);
                props = props
                    .set_column_compression(path.clone(), chunk.compression())
                    .set_column_dictionary_enabled(path, dictionary);
            }
        } else {
            let root = out_descr.get_column_root(leaf).name();
            props = props.set_column_dictionary_enabled(path, root == OUTPUT_COLUMNS[2]);
        }
    }
    Ok(props.build())
}

/// Whether `chunk` was dictionary encoded throughout: every data page a dictionary page
/// reference. Without page statistics, whether it used a dictionary at all.
fn dictionary_held(chunk: &ColumnChunkMetaData) -> bool {
    let is_dict = |e: Encoding| matches!(e, Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY);
    match chunk.page_encoding_stats_mask() {
        Some(data_pages) => {
            chunk.dictionary_page_offset().is_some()
                && (data_pages.is_only(Encoding::RLE_DICTIONARY) || data_pages.is_only(Encoding::PLAIN_DICTIONARY))
        }
        None => chunk.encodings().any(is_dict),
    }
}
