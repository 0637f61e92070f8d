export const alsoClean = 2;
