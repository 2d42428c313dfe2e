//! A table of the driver's state (volumes, snapshots or group snapshots by ID) that knows which
//! rows a transaction changed, so that committing one costs the rows it touched, not the size
//! of the state: the store journals just those rows, and an error puts just those back.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Debug, Clone)]
pub struct Table<T> {
    rows: BTreeMap<String, T>,
    /// Each row the open transaction may have changed, as it was before (`None`: absent).
    before: BTreeMap<String, Option<T>>,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Self {
            rows: BTreeMap::new(),
            before: BTreeMap::new(),
        }
    }
}

/// Two tables are equal when their rows are: what a transaction touched is not content.
impl<T: PartialEq> PartialEq for Table<T> {
    fn eq(&self, other: &Self) -> bool {
        self.rows == other.rows
    }
}

impl<T: Eq> Eq for Table<T> {}

impl<T: Serialize> Serialize for Table<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.rows.serialize(serializer)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Table<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Self {
            rows: BTreeMap::deserialize(deserializer)?,
            before: BTreeMap::new(),
        })
    }
}

impl<'a, T> IntoIterator for &'a Table<T> {
    type Item = (&'a String, &'a T);
    type IntoIter = std::collections::btree_map::Iter<'a, String, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.rows.iter()
    }
}

impl<T: Clone + PartialEq> Table<T> {
    pub fn get(&self, id: &str) -> Option<&T> {
        self.rows.get(id)
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.rows.contains_key(id)
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.rows.keys()
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.rows.values()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &T)> {
        self.rows.iter()
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut T> {
        self.remember(id);
        self.rows.get_mut(id)
    }

    /// The first row (in ID order) that `matches`, to change.
    pub fn find_mut(&mut self, matches: impl Fn(&T) -> bool) -> Option<&mut T> {
        let id = self
            .rows
            .iter()
            .find(|(_, row)| matches(row))
            .map(|(id, _)| id.clone())?;
        self.get_mut(&id)
    }

    pub fn insert(&mut self, id: String, row: T) -> Option<T> {
        self.remember(&id);
        self.rows.insert(id, row)
    }

    pub fn remove(&mut self, id: &str) -> Option<T> {
        self.remember(id);
        self.rows.remove(id)
    }

    /// Every row, to change: the transaction then costs the whole table (recovery only).
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        for (id, row) in &self.rows {
            self.before
                .entry(id.clone())
                .or_insert_with(|| Some(row.clone()));
        }
        self.rows.values_mut()
    }

    fn remember(&mut self, id: &str) {
        if !self.before.contains_key(id) {
            self.before
                .insert(id.to_string(), self.rows.get(id).cloned());
        }
    }

    /// Ends the open transaction, keeping its changes: the rows that differ from before it,
    /// with their new content (`None`: removed).
    pub(crate) fn commit(&mut self) -> BTreeMap<String, Option<T>> {
        std::mem::take(&mut self.before)
            .into_iter()
            .filter(|(id, before)| self.rows.get(id) != before.as_ref())
            .map(|(id, _)| {
                let now = self.rows.get(&id).cloned();
                (id, now)
            })
            .collect()
    }

    /// Ends the open transaction, putting every row it touched back as it was.
    pub(crate) fn roll_back(&mut self) {
        for (id, before) in std::mem::take(&mut self.before) {
            match before {
                Some(row) => self.rows.insert(id, row),
                None => self.rows.remove(&id),
            };
        }
    }

    /// Applies changes committed elsewhere (a journal entry), outside any transaction.
    pub(crate) fn apply(&mut self, changes: BTreeMap<String, Option<T>>) {
        for (id, row) in changes {
            match row {
                Some(row) => self.rows.insert(id, row),
                None => self.rows.remove(&id),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(rows: &[(&str, u32)]) -> Table<u32> {
        let mut table = Table::default();
        table.apply(
            rows.iter()
                .map(|(id, row)| (id.to_string(), Some(*row)))
                .collect(),
        );
        table
    }

    /// A case: its name, what the transaction does, and what it commits.
    type Case = (
        &'static str,
        fn(&mut Table<u32>),
        &'static [(&'static str, Option<u32>)],
    );

    #[test]
    fn a_commit_names_only_the_rows_that_changed() {
        let cases: &[Case] = &[
            ("nothing", |_| {}, &[]),
            ("read only", |t| assert_eq!(t.get("a"), Some(&1)), &[]),
            (
                "changed",
                |t| *t.get_mut("a").unwrap() = 5,
                &[("a", Some(5))],
            ),
            ("touched, same value", |t| *t.get_mut("a").unwrap() = 1, &[]),
            (
                "inserted",
                |t| _ = t.insert("c".into(), 3),
                &[("c", Some(3))],
            ),
            ("removed", |t| _ = t.remove("b"), &[("b", None)]),
            (
                "removed and put back",
                |t| {
                    t.remove("b");
                    t.insert("b".into(), 2);
                },
                &[],
            ),
            (
                "missing row asked for",
                |t| assert!(t.get_mut("z").is_none()),
                &[],
            ),
            (
                "found by content",
                |t| *t.find_mut(|v| *v == 2).unwrap() = 9,
                &[("b", Some(9))],
            ),
            (
                "every row",
                |t| t.values_mut().for_each(|v| *v += 1),
                &[("a", Some(2)), ("b", Some(3))],
            ),
        ];
        for (name, change, expected) in cases {
            let mut t = table(&[("a", 1), ("b", 2)]);
            change(&mut t);
            let committed = t.commit();
            let expected: BTreeMap<String, Option<u32>> = expected
                .iter()
                .map(|(id, v)| (id.to_string(), *v))
                .collect();
            assert_eq!(committed, expected, "{name}");
            assert!(
                t.commit().is_empty(),
                "{name}: a commit ends the transaction"
            );
        }
    }

    #[test]
    fn a_roll_back_restores_every_touched_row() {
        let mut t = table(&[("a", 1), ("b", 2)]);
        *t.get_mut("a").unwrap() = 7;
        t.remove("b");
        t.insert("c".into(), 3);
        t.values_mut().for_each(|v| *v = 0);
        t.roll_back();
        assert_eq!(t, table(&[("a", 1), ("b", 2)]));
        assert!(t.commit().is_empty());
    }

    #[test]
    fn serialized_as_a_plain_map() {
        let t = table(&[("a", 1)]);
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(text, r#"{"a":1}"#);
        assert_eq!(serde_json::from_str::<Table<u32>>(&text).unwrap(), t);
    }
}
